package credplugins

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// Interceptors returns the injector's one interceptor, on PullImage, for
// criproxy.New: credential injection on a proxy without ensure, the
// runtime (and what is inside it) each try.
func (in *Injector) Interceptors() []criproxy.Interceptor {
	return []criproxy.Interceptor{criproxy.Intercept(criproxy.PullImage, in.PullImage)}
}

// PullImage is Pull as an interceptor: each try goes on to next.
func (in *Injector) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	resp, _, err := in.Pull(ctx, req, next)
	return resp, err
}

// Pull is a pull with the configured plugins' credentials: each try of
// Tries goes on to next, until one succeeds. It returns the runtime's
// answer to that try and which credential it was.
func (in *Injector) Pull(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, pullcred.Used, error) {
	tries := in.Tries(req)
	var resp *runtimeapi.PullImageResponse
	for try := range tries.All(ctx) {
		var err error
		resp, err = next(ctx, try)
		tries.Answer(err)
	}
	used, err := tries.Result()
	if err != nil {
		return nil, used, err
	}
	return resp, used, nil
}

// Tries is the credentials one pull goes with (pullcred.Tries). A request
// with its own auth (the kubelet's pull secrets, crictl --creds) is tried
// as it is first; when the registry refuses it, the plugins' candidates
// for the image follow, as in the kubelet, whose keyring tries the pod's
// secrets and then the node's credentials (the plugins, which the proxy
// runs in its place). A request without auth goes to the candidates of
// Lookup directly; Lookup runs only once they are needed. Candidates are
// tried in order, username and password only, server_address left empty
// (containerd drops or rejects an auth whose address is not the host it
// contacts, mirrors included), until one succeeds: its provider (and
// service account) is the result, so that a record holds the credential
// that succeeded. With no candidate, a request with auth gets its own
// try's error, one without is tried anonymously. When every try fails,
// the error lists what was tried, never a secret, and carries the last
// try's status code.
type Tries struct {
	in  *Injector
	req *runtimeapi.PullImageRequest
	// answer is the answer to the try yielded last; left is set once the
	// caller's loop stopped asking for more.
	answer error
	left   bool
	used   pullcred.Used
	err    error
}

// Tries returns the tries of a pull of req.
func (in *Injector) Tries(req *runtimeapi.PullImageRequest) pullcred.Tries {
	return &Tries{in: in, req: req, err: errNotTried}
}

// errNotTried is the result of tries that were never run, or a try the
// caller did not answer: a mistake that fails the pull rather than
// passing it.
var errNotTried = errors.New("credplugins: a try of the pull was not answered")

// All yields the tries, in order; see Tries.
func (t *Tries) All(ctx context.Context) iter.Seq[*runtimeapi.PullImageRequest] {
	return func(yield func(*runtimeapi.PullImageRequest) bool) {
		t.used, t.err = t.run(ctx, yield)
	}
}

// Answer is the answer to the try All yielded last.
func (t *Tries) Answer(err error) { t.answer = err }

// Result is the credential of the try that succeeded, or the pull's error.
func (t *Tries) Result() (pullcred.Used, error) { return t.used, t.err }

// try yields r, one try, and returns its answer.
func (t *Tries) try(yield func(*runtimeapi.PullImageRequest) bool, r *runtimeapi.PullImageRequest) error {
	t.answer = errNotTried
	if !yield(r) || t.answer == errNotTried {
		// The caller's loop broke off, or did not answer: no further try.
		t.left = true
	}
	return t.answer
}

// run is the tries, in order, and their result.
func (t *Tries) run(ctx context.Context, yield func(*runtimeapi.PullImageRequest) bool) (pullcred.Used, error) {
	in, req := t.in, t.req
	var own error // the request's own credential failed with it
	if hasAuth(req.GetAuth()) {
		err := t.try(yield, req)
		if err == nil || ctx.Err() != nil || t.left {
			in.pulls.WithLabelValues("request_auth").Inc()
			return pullcred.Used{}, err
		}
		own = err
	}
	image, ok := imageref.Repository(req.GetImage().GetImage())
	if !ok {
		if own != nil {
			return pullcred.Used{}, own
		}
		return pullcred.Used{}, t.try(yield, req) // not a name we can match; the runtime will say why
	}
	var pod *PodRef
	if m := req.GetSandboxConfig().GetMetadata(); m != nil {
		pod = &PodRef{Namespace: m.GetNamespace(), Name: m.GetName(), UID: m.GetUid()}
	}
	cands, _, failed := in.Lookup(ctx, image, pod)
	if len(cands) == 0 {
		if own != nil {
			in.pulls.WithLabelValues("failed").Inc()
			return pullcred.Used{}, own
		}
		err := t.try(yield, req)
		if err != nil && len(failed) > 0 {
			in.pulls.WithLabelValues("failed").Inc()
			return pullcred.Used{}, pullError(err, req.GetImage().GetImage(), nil, nil, failed)
		}
		in.pulls.WithLabelValues("anonymous").Inc()
		return pullcred.Used{}, err
	}

	var tried []attempt
	for _, c := range cands {
		r := proto.CloneOf(req)
		r.Auth = nil
		if c.Credential != (Credential{}) { // an empty credential is an anonymous try (ACR's "*.azurecr.*")
			r.Auth = &runtimeapi.AuthConfig{Username: c.Credential.Username, Password: c.Credential.Password}
		}
		err := t.try(yield, r)
		if err == nil {
			result := "injected"
			if own != nil {
				result = "request_auth_fallback"
			}
			in.pulls.WithLabelValues(result).Inc()
			in.log.Debug("pulled with a credential provider's credential", "image", req.GetImage().GetImage(),
				"plugin", c.Provider, "key", c.Key, "tries", len(tried)+1, "afterTheRequestsOwn", own != nil)
			return pullcred.Used{Provider: c.Provider, ServiceAccount: c.ServiceAccount}, nil
		}
		tried = append(tried, attempt{Candidate: c, err: err})
		if ctx.Err() != nil || t.left {
			break // the caller gave up; do not go on knocking at the registry
		}
	}
	in.pulls.WithLabelValues("failed").Inc()
	return pullcred.Used{}, pullError(tried[len(tried)-1].err, req.GetImage().GetImage(), own, tried, failed)
}

// attempt is one failed try.
type attempt struct {
	Candidate
	err error
}

// pullError keeps the runtime's last status code and lists what was tried:
// provider, key and the runtime's message, never a username or password.
func pullError(last error, image string, own error, tried []attempt, failed []ProviderError) error {
	var b strings.Builder
	fmt.Fprintf(&b, "pulling %s with credentials from credential provider plugins failed:", image)
	if own != nil {
		fmt.Fprintf(&b, " [0] the request's own credential: %s;", status.Convert(own).Message())
	}
	for i, t := range tried {
		fmt.Fprintf(&b, " [%d] plugin %s, key %q: %s;", i+1, t.Provider, t.Key, status.Convert(t.err).Message())
	}
	if len(tried) == 0 {
		fmt.Fprintf(&b, " no credential to try, the anonymous pull failed: %s;", status.Convert(last).Message())
	}
	for _, f := range failed {
		fmt.Fprintf(&b, " plugin %s gave no credentials: %v;", f.Provider, f.Err)
	}
	code := status.Code(last)
	if code == codes.OK {
		code = codes.Unknown
	}
	return status.Error(code, strings.TrimSuffix(b.String(), ";"))
}

// hasAuth reports whether a request carries any credential.
func hasAuth(a *runtimeapi.AuthConfig) bool {
	return a != nil && (a.Username != "" || a.Password != "" || a.Auth != "" || a.IdentityToken != "" || a.RegistryToken != "")
}
