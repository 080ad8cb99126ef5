package registry

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/auth"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
)

// authState is how a check's requests authenticate, for one challenge.
type authState struct {
	ch         *challenge        // the challenge answered; nil: none known yet
	authorizer docker.Authorizer // nil: requests go without Authorization
}

// newAuthState seeds a new containerd authorizer with ch, as if the
// endpoint had just answered a 401 with it: the next request carries the
// credential (for a bearer challenge, after the token request) without a
// 401 round first.
func (k *check) newAuthState(ctx context.Context, ch challenge) *authState {
	st := &authState{ch: &ch}
	if k.cred.Kind() == KindRegistryToken {
		return st // sent as is, whatever the challenge
	}
	a := docker.NewDockerAuthorizer(
		docker.WithAuthClient(k.client),
		docker.WithAuthCreds(k.cred.hostCredentials()),
		docker.WithAuthHeader(k.ep.host.Header),
	)
	seed := &http.Response{
		StatusCode: http.StatusUnauthorized,
		Header:     http.Header{"Www-Authenticate": []string{ch.header()}},
		Request: &http.Request{Method: http.MethodGet,
			URL: &url.URL{Scheme: k.ep.host.Scheme, Host: k.ep.host.Host, Path: k.ep.host.Path + "/"}},
	}
	if err := a.AddResponses(ctx, []*http.Response{seed}); err != nil {
		// The credential cannot answer ch (anonymous, or a token, on
		// basic): its requests go without Authorization; a 401 refuses.
		return st
	}
	st.authorizer = a
	return st
}

func (k *check) currentAuth() *authState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.auth
}

// learn makes ch the check's challenge, unless a request running in
// parallel already did.
func (k *check) learn(ctx context.Context, ch challenge) *authState {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.auth.ch == nil || *k.auth.ch != ch {
		k.auth = k.newAuthState(ctx, ch)
	}
	return k.auth
}

// tokenFailure classifies an error of containerd's authorizer (the token
// request, mostly) without its text, which quotes the token URL's query.
func tokenFailure(err error) *Error {
	var st remoteerrors.ErrUnexpectedStatus
	switch {
	case errors.As(err, &st):
		realm := "the token endpoint"
		if u, perr := url.Parse(st.RequestURL); perr == nil {
			realm += " " + u.Scheme + "://" + u.Host + u.Path
		}
		switch st.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return failure(ErrDenied, "access denied", "%s refused the credential: %d", realm, st.StatusCode)
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusRequestURITooLong, http.StatusRequestHeaderFieldsTooLarge:
			return failure(ErrDenied, "the registry refused the request", "%s refused the token request: %d", realm, st.StatusCode)
		}
		return failure(ErrUnreachable, "token request failed", "%s answered %d", realm, st.StatusCode)
	case errors.Is(err, docker.ErrInvalidAuthorization):
		return failure(ErrDenied, "access denied", "the credential cannot answer the registry's challenge")
	case errors.Is(err, auth.ErrNoToken):
		return failure(ErrUnreachable, "token request failed", "the token endpoint answered without a token")
	}
	return transportFailure("token request", err)
}
