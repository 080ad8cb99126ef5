package pullcred

import (
	"context"
	"errors"
	"iter"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Tries is the credentials one pull goes with, one try each, in the order
// they are tried: the request's own, then credential injection's (the
// kubelet's keyring order). The caller loops over All, pulls with each
// request it yields and answers it (Answer) before the next: the
// sequence goes on past a try that failed only while ctx lasts, and ends
// at the first that succeeded. Result then says which credential that
// was, or why every try failed.
//
// *credplugins.Tries is the real one; Own is a pull with no credential
// injection.
type Tries interface {
	// All yields each try's request: the pull with the try's credential in
	// Auth (none for an anonymous try).
	All(ctx context.Context) iter.Seq[*runtimeapi.PullImageRequest]
	// Answer is the answer to the try All yielded last: nil if it
	// succeeded.
	Answer(err error)
	// Result is, once the loop is over, the credential of the try that
	// succeeded, or the pull's error when none did.
	Result() (Used, error)
}

// Own is the one try of req with its own credential (or none): a pull
// with no credential injection.
func Own(req *runtimeapi.PullImageRequest) Tries {
	return &own{req: req, err: errNotTried}
}

// errNotTried is the result of a sequence whose one try was never
// answered: a caller's mistake, which fails the pull rather than passing it.
var errNotTried = errors.New("pullcred: the pull's try was not answered")

type own struct {
	req *runtimeapi.PullImageRequest
	err error
}

func (o *own) All(context.Context) iter.Seq[*runtimeapi.PullImageRequest] {
	return func(yield func(*runtimeapi.PullImageRequest) bool) { yield(o.req) }
}

func (o *own) Answer(err error)      { o.err = err }
func (o *own) Result() (Used, error) { return Used{}, o.err }
