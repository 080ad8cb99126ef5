package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// userAgent names the check in the registry's logs.
const userAgent = "cri-image-proxy (registry check)"

// checkRedirect follows a GET's redirects, up to 10, and none of a HEAD:
// a registry redirects a blob request to its storage only once it found
// the blob in the repository for the credential, and a storage URL signed
// for GET may refuse a HEAD.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if via[0].Method == http.MethodHead {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

func isRedirect(code int) bool {
	switch code {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

// url is the endpoint's URL of p ("/manifests/v1") in the repository.
func (k *check) url(p string) string {
	u := url.URL{Scheme: k.ep.host.Scheme, Host: k.ep.host.Host, Path: k.ep.host.Path + "/" + k.name.repository + p}
	if ns := k.ep.namespace(); ns != "" {
		u.RawQuery = url.Values{"ns": {ns}}.Encode()
	}
	return u.String()
}

// do sends one request of the check and returns any answer but a 401. A
// 401 with a challenge other than the one answered (none known yet, or a
// stale one) is learnt, remembered for the endpoint, and the request sent
// once more; any other 401 is ErrDenied.
func (k *check) do(ctx context.Context, method, p, accept string) (*http.Response, error) {
	what := method + " " + k.name.repository + p
	for attempt := 0; ; attempt++ {
		st := k.currentAuth()
		req, err := http.NewRequestWithContext(ctx, method, k.url(p), nil)
		if err != nil {
			return nil, failure(ErrUnreachable, "invalid request", "%s: %s", what, sanitize(err))
		}
		for key, v := range k.ep.host.Header {
			req.Header[key] = append([]string(nil), v...)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		if req.Header.Get("User-Agent") == "" {
			req.Header.Set("User-Agent", userAgent)
		}
		switch {
		case k.cred.Kind() == KindRegistryToken:
			req.Header.Set("Authorization", "Bearer "+k.cred.RegistryToken)
		case st.authorizer != nil:
			if err := st.authorizer.Authorize(ctx, req); err != nil {
				return nil, tokenFailure(err)
			}
		}
		resp, err := k.client.Do(req)
		if err != nil {
			return nil, transportFailure(what, err)
		}
		if resp.StatusCode != http.StatusUnauthorized {
			return resp, nil
		}
		if resp.Request != nil && resp.Request.URL.Host != req.URL.Host {
			// A redirect's target (the registry's storage) refused: its
			// challenge is that host's, never the endpoint's, and the
			// credential is not the storage's to have.
			target := resp.Request.URL.Scheme + "://" + resp.Request.URL.Host
			discard(resp)
			return nil, failure(ErrUnreachable, "the registry's storage refused the request", "%s: redirected to %s, which answered 401", what, target)
		}
		ch, ok := challengeFrom(resp.Header)
		discard(resp)
		if !ok {
			return nil, failure(ErrDenied, "access denied", "%s: 401 with no challenge a client can answer", what)
		}
		k.c.challenges.remember(k.ep.String(), ch)
		if attempt > 0 || k.cred.Kind() == KindRegistryToken || (st.ch != nil && *st.ch == ch) {
			return nil, failure(ErrDenied, "access denied", "%s: 401 for this %s credential (challenge: %s)", what, k.cred.Kind(), ch)
		}
		if next := k.learn(ctx, ch); next.authorizer == nil {
			return nil, failure(ErrDenied, "access denied", "%s: 401: the registry asks for %s authentication; the credential is %s", what, ch, k.cred.Kind())
		}
	}
}

// statusFailure is an answer's status as a failure; the registry's error
// codes, and nothing else of its body, go in the detail.
func statusFailure(what string, resp *http.Response) *Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	detail := fmt.Sprintf("%s: %d", what, resp.StatusCode)
	if codes := registryCodes(body); codes != "" {
		detail += " " + codes
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return failure(ErrDenied, "not found in the repository", "%s", detail)
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusRequestURITooLong, http.StatusRequestHeaderFieldsTooLarge:
		// The request itself was refused (a pull secret too large for the
		// registry's headers, a name it will not take): a refusal of this
		// request, not a registry that cannot be asked.
		return failure(ErrDenied, "the registry refused the request", "%s", detail)
	case http.StatusUnauthorized, http.StatusForbidden:
		return failure(ErrDenied, "access denied", "%s", detail)
	case http.StatusTooManyRequests:
		return failure(ErrUnreachable, "rate limited by the registry", "%s", detail)
	}
	return failure(ErrUnreachable, "registry error", "%s", detail)
}

func discard(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// checkTransport counts and times a check's requests and bounds every
// answer's body.
type checkTransport struct {
	base http.RoundTripper
	k    *check
}

func (t *checkTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.k.requests.Add(1)
	if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/") {
		t.k.manifestGets.Add(1)
	}
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	t.k.observe.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, err
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: bodyLimit(req.Context())}
	return resp, nil
}

var errBodyTooLarge = errors.New("answer over the size bound")

// cappedBody fails a read past its bound: a hostile registry or token
// endpoint cannot make a check hold more than that in memory.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, errBodyTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
