package registry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// The three answers a check can fail with, matched with errors.Is, and
// ErrForged, a refusal told apart. Every one fails closed: the caller
// records nothing.
var (
	// ErrDenied: the registry refused this credential for this image in
	// this repository: 401 or 403 (from the registry or its token
	// endpoint), a manifest or blob unknown to the repository (404), or
	// (ErrForged) bytes served for the config or a proven layer that are
	// not that content.
	ErrDenied = errors.New("denied by the registry")
	// ErrMoved: the reference resolves to other content than the image ID
	// the caller named (the tag moved, or the runtime holds something
	// else), or, with no image ID, to no image for the platform.
	ErrMoved = errors.New("the reference resolves to other content")
	// ErrUnreachable: the registry's word could not be had: network, TLS,
	// timeout, 429, 5xx, an unexpected status, an answer that is garbage,
	// oversized, or that does not match its own digest.
	ErrUnreachable = errors.New("the registry could not be asked")
	// ErrForged: the registry served, for content the image names by
	// digest and that it must serve to prove it holds it (the config, a
	// layer a proof fetches), bytes that are not that content: a registry
	// naming an image it does not hold (another tenant's image ID or
	// layers), or one whose storage is corrupt. It is a kind of ErrDenied
	// (errors.Is matches both): it refuses the pull as any refusal does,
	// no retry making the bytes the content, and is told apart for the
	// operator and the metrics, which count it as "forged".
	ErrForged = fmt.Errorf("%w (forged content)", ErrDenied)
)

// Error is what Check returns when a check fails. Its Error() is for the
// operator (the endpoint, the cause, digests); Reason is short, for the pod.
// Neither ever holds a credential, a token or an Authorization header.
type Error struct {
	Kind     error  // ErrDenied (or ErrForged), ErrMoved or ErrUnreachable
	Endpoint string // the endpoint asked, "https://registry-1.docker.io/v2"
	Reason   string // short: "not found in the repository", "2 of 5 blobs not readable"
	Detail   string // the operator's detail: statuses, digests, the cause
	ctxErr   error  // context.Canceled or DeadlineExceeded when that was the cause
	// overBound: a layer proof stopped at one of its bounds (ErrUnreachable,
	// as every answer over a size bound), told apart for the proofs metric.
	overBound bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("registry check")
	if e.Endpoint != "" {
		b.WriteString(" at ")
		b.WriteString(e.Endpoint)
	}
	b.WriteString(": ")
	b.WriteString(e.Kind.Error())
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	if e.Detail != "" {
		b.WriteString(" (")
		b.WriteString(e.Detail)
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap makes errors.Is see the kind, and a context's own error when the
// check ended because its context did.
func (e *Error) Unwrap() []error {
	if e.ctxErr != nil {
		return []error{e.Kind, e.ctxErr}
	}
	return []error{e.Kind}
}

// failure builds an *Error; the endpoint is filled in by the check.
func failure(kind error, reason, detailFormat string, args ...any) *Error {
	return &Error{Kind: kind, Reason: reason, Detail: fmt.Sprintf(detailFormat, args...)}
}

// forgery is a refusal of bytes that are not the content their digest
// names (ErrForged).
func forgery(reason, detailFormat string, args ...any) *Error {
	return failure(ErrForged, reason, detailFormat, args...)
}

// overProofBound is a layer proof stopped at one of its bounds: the
// compressed bytes, the decompressed bytes, a zstd frame's window. Not a
// forgery (the bytes may well be the content: nothing says they are not),
// and the pull is refused all the same: ErrUnreachable, as every answer
// over a size bound.
func overProofBound(detailFormat string, args ...any) *Error {
	e := failure(ErrUnreachable, "a layer is over the proof bound", detailFormat, args...)
	e.overBound = true
	return e
}

// transportFailure describes an error of the HTTP client (network, TLS,
// timeout) without anything a URL's query may carry.
func transportFailure(what string, err error) *Error {
	e := failure(ErrUnreachable, "registry unreachable", "%s: %s", what, sanitize(err))
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		e.Reason, e.ctxErr = "timed out", context.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		e.Reason, e.ctxErr = "canceled", context.Canceled
	}
	return e
}

var queryInText = regexp.MustCompile(`\?[^\s"]*`)

// sanitize is err's text with every URL's query and user info removed:
// the URLs a check makes carry no credential, but a token endpoint's realm
// is the registry's to choose. Like containerd's SanitizeError.
func sanitize(err error) string {
	if err == nil {
		return ""
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		u, perr := url.Parse(ue.URL)
		target := "(an invalid URL)"
		if perr == nil {
			u.RawQuery, u.User, u.Fragment = "", nil, ""
			target = u.String()
		}
		return fmt.Sprintf("%s %s: %s", ue.Op, target, queryInText.ReplaceAllString(ue.Err.Error(), ""))
	}
	return queryInText.ReplaceAllString(err.Error(), "")
}

var errorCode = regexp.MustCompile(`^[A-Z][A-Z_]{0,39}$`)

// registryCodes returns the error codes ("MANIFEST_UNKNOWN", "DENIED")
// of a registry's error body, and nothing else of it: the messages are the
// registry's free text.
func registryCodes(body []byte) string {
	var codes []string
	for _, m := range errorCodeField.FindAllSubmatch(body, 8) {
		if c := string(m[1]); errorCode.MatchString(c) {
			codes = append(codes, c)
		}
	}
	return strings.Join(codes, ",")
}

var errorCodeField = regexp.MustCompile(`"code"\s*:\s*"([^"]{1,40})"`)

// Refusal is a check that failed, as the pod's owner sees it: the image
// as the pod named it and the registry's short reason, nothing of another
// tenant's (no digest: the operator's log has them). A refusal is
// PermissionDenied, a forged answer (bytes that are not the content their
// digest names) too, a registry that cannot be asked Unavailable, an
// answer that is not the image Aborted (retry).
func Refusal(image string, err error) error {
	var rerr *Error
	reason := "the registry check could not be made"
	if errors.As(err, &rerr) && rerr.Reason != "" {
		reason = rerr.Reason
	}
	var code error
	switch {
	case errors.Is(err, ErrForged):
		// A refusal of this pull, whatever else the error says: a retry
		// fetches the same bytes.
		code = errdefs.ErrPermissionDenied
	case errors.Is(err, ErrDenied):
		code = errdefs.ErrPermissionDenied
	case errors.Is(err, ErrMoved):
		code = errdefs.ErrAborted
	case errors.Is(err, ErrUnreachable):
		code = errdefs.ErrUnavailable
	default:
		code = errdefs.ErrInvalidArgument
	}
	return fmt.Errorf("pulling %s: %s: %w", image, reason, code)
}
