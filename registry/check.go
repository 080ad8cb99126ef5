package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/auth"
	remoteerrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
)

// userAgent names the check in the registry's logs.
const userAgent = "cri-image-proxy (registry check)"

// check is one Check's state: its endpoint, its own HTTP client (which
// counts and times its requests) and its own authorizer. Tokens live in
// that authorizer and die with the check: nothing fetched with one
// credential ever serves another's check.
type check struct {
	c            *Checker
	name         imageName
	cred         Credential
	res          *Result
	ep           *endpoint
	client       *http.Client
	observe      prometheus.Observer
	requests     atomic.Int64
	manifestGets atomic.Int64

	mu   sync.Mutex
	auth *authState
}

// authState is how a check's requests authenticate, for one challenge.
type authState struct {
	ch         *challenge        // the challenge answered; nil: none known yet
	authorizer docker.Authorizer // nil: requests go without Authorization
}

func (k *check) start(ctx context.Context, ep *endpoint) {
	k.ep = ep
	k.observe = k.c.metrics.requests.WithLabelValues(k.c.labels.registry(k.name.registry), k.c.labels.endpoint(ep))
	base := ep.host.Client.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	k.client = &http.Client{Transport: &checkTransport{base: base, k: k}, CheckRedirect: checkRedirect}
	k.auth = &authState{}
	if ch, ok := k.c.challenges.get(ep.String()); ok {
		k.auth = k.newAuthState(ctx, ch)
	}
}

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

// run resolves the reference, picks the platform's manifest, compares its
// config with imageID and, with blobs, fetches the config (its bytes
// verified), proves each layer present, and proves by their bytes the
// layers chooser names.
func (k *check) run(ctx context.Context, imageID digest.Digest, spec ocispec.Platform, blobs bool, chooser LayerChooser) error {
	platform := platforms.Only(spec)
	// The token scope, as containerd's resolver asks it.
	ctx = docker.ContextWithAppendPullRepositoryScope(ctx, k.name.repository)
	// The registry's answers are bounded; the proof of layers (its own
	// bound) and the caller's question are not by this.
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, k.c.timeout)
	defer cancel()
	// Manifests taken from the cache that the registry was not asked for in
	// this check: a HEAD must show the repository holds them for this
	// credential.
	var prove []digest.Digest

	m, d, asked, err := k.resolve(ctx)
	if err != nil {
		return err
	}
	// The endpoint answered the reference as a registry does: it may name
	// its own metric series from now on (within the bound).
	k.c.labels.earn(k.name.registry, k.ep)
	if !asked {
		prove = append(prove, d)
	}
	k.res.ManifestDigest = d
	for depth := 0; m.index; depth++ {
		if depth == maxIndexDepth {
			return failure(ErrUnreachable, "invalid answer", "indexes nested deeper than %d", maxIndexDepth)
		}
		desc, ok := pickManifest(m.manifests, platform)
		if !ok {
			return failure(ErrMoved, "no image for this platform", "index %s has no manifest for %s", d, platforms.Format(spec))
		}
		var fetched bool
		if m, fetched, err = k.manifestByDigest(ctx, desc); err != nil {
			return err
		}
		if !fetched && blobs {
			prove = append(prove, desc.Digest)
		}
		d = desc.Digest
	}
	k.res.ImageManifest, k.res.ConfigDigest = d, m.config.Digest
	k.res.Blobs = append(k.res.Blobs, m.config.Digest)
	for _, b := range m.layers {
		k.res.Blobs = append(k.res.Blobs, b.Digest)
	}
	if imageID != "" && m.config.Digest != imageID {
		return failure(ErrMoved, "the reference resolves to another image", "%s resolves to image %s, not %s", k.name, m.config.Digest, imageID)
	}
	if !blobs {
		// Resolving only: prove holds the reference itself, when it came
		// from the cache.
		if len(prove) == 0 {
			return nil
		}
		_, err := k.heads(ctx, prove, nil, nil)
		return err
	}
	// One round: the config's bytes (GET), and a HEAD of each layer and of
	// each manifest taken from the cache.
	config, err := k.heads(ctx, prove, &m.config, m.layers)
	if err != nil {
		return err
	}
	layers, err := layersOf(config, m.layers)
	if err != nil {
		return failure(ErrUnreachable, "invalid answer", "image %s: %v", m.config.Digest, err)
	}
	k.res.Layers = layers
	if chooser == nil {
		return nil
	}
	cancel()
	want, err := chooser(parent, m.config.Digest, layers)
	if err != nil {
		return err
	}
	return k.proveLayers(parent, layers, want)
}

// resolve answers what the reference names, and whether the registry was
// asked for it in this check (asked is false for a digest reference found
// in the cache, served before at this endpoint and repository). A tag
// whose digest is remembered, with that manifest in the cache, served
// here, is asked with a HEAD: a GET of a manifest counts as a pull
// against some registries' rate limits (Docker Hub), a HEAD does not, and
// the runtime's own re-check is a HEAD. Any other answer to that HEAD (the
// tag moved, no digest named) and any other reference is a GET, verified
// against the digest asked for and the one the registry names: a registry
// has to serve a manifest's bytes at least once before a HEAD naming its
// digest counts.
func (k *check) resolve(ctx context.Context) (m *manifest, d digest.Digest, asked bool, err error) {
	p := "/manifests/" + k.name.object
	if k.name.digest != "" {
		if m, servedHere := k.c.manifests.get(k.name.digest, k.place()); servedHere {
			return m, k.name.digest, false, nil
		}
	} else if d, ok := k.c.tags.get(k.tagKey()); ok {
		if m, servedHere := k.c.manifests.get(d, k.place()); servedHere {
			resp, err := k.do(ctx, http.MethodHead, p, acceptManifests)
			if err != nil {
				return nil, "", false, err
			}
			if resp.StatusCode != http.StatusOK && !isRedirect(resp.StatusCode) {
				return nil, "", false, statusFailure("HEAD "+k.name.repository+p, resp)
			}
			discard(resp)
			if resp.StatusCode == http.StatusOK && resp.Header.Get("Docker-Content-Digest") == d.String() {
				return m, d, true, nil
			}
		}
	}
	resp, err := k.do(ctx, http.MethodGet, p, acceptManifests)
	if err != nil {
		return nil, "", false, err
	}
	body, err := readManifest(resp, "GET "+k.name.repository+p)
	if err != nil {
		return nil, "", false, err
	}
	if k.name.digest != "" {
		if err := verifyDigest(body, k.name.digest); err != nil {
			return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: the answer is not the content asked for: %v", k.name.repository, p, err)
		}
		d = k.name.digest
	}
	if h := resp.Header.Get("Docker-Content-Digest"); h != "" {
		hd, err := digest.Parse(h)
		if err == nil {
			err = verifyDigest(body, hd)
		}
		if err != nil {
			return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: Docker-Content-Digest does not name the body: %v", k.name.repository, p, err)
		}
		if d == "" {
			d = hd
		}
	}
	if d == "" {
		d = digest.FromBytes(body)
	}
	m, err = parseManifest(body, contentType(resp.Header.Get("Content-Type")))
	if err != nil {
		return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	k.c.manifests.put(d, m, int64(len(body)), k.place())
	if k.name.digest == "" {
		k.c.tags.put(k.tagKey(), d)
	}
	return m, d, true, nil
}

// tagKey names the reference's tag at this endpoint, for the tag memory.
func (k *check) tagKey() string { return k.ep.String() + " " + k.name.String() }

// place names the endpoint and repository a check asks, for the manifest
// cache's memory of where a manifest's bytes were served.
func (k *check) place() string { return k.ep.String() + " " + k.name.repository }

// manifestByDigest is an index's entry: from the cache where this
// repository served it before (fetched is false: a HEAD must still prove
// it), else GET by digest here, so that an index of another registry's
// naming a manifest it cannot serve gains nothing.
func (k *check) manifestByDigest(ctx context.Context, desc ocispec.Descriptor) (m *manifest, fetched bool, err error) {
	if m, servedHere := k.c.manifests.get(desc.Digest, k.place()); servedHere {
		return m, false, nil
	}
	p := "/manifests/" + desc.Digest.String()
	resp, err := k.do(ctx, http.MethodGet, p, acceptManifests)
	if err != nil {
		return nil, false, err
	}
	body, err := readManifest(resp, "GET "+k.name.repository+p)
	if err != nil {
		return nil, false, err
	}
	if err := verifyDigest(body, desc.Digest); err != nil {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	if int64(len(body)) != desc.Size {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %d bytes, the index says %d", k.name.repository, p, len(body), desc.Size)
	}
	m, err = parseManifest(body, desc.MediaType)
	if err == nil && (isIndexType(desc.MediaType) || desc.MediaType == ocispec.MediaTypeImageManifest || desc.MediaType == mediaTypeDockerManifest) && m.index != isIndexType(desc.MediaType) {
		err = fmt.Errorf("the index names media type %s for another kind of content", desc.MediaType)
	}
	if err != nil {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	k.c.manifests.put(desc.Digest, m, int64(len(body)), k.place())
	return m, true, nil
}

// readManifest reads a manifest answer, bounded; any status but 200 is a
// failure.
func readManifest(resp *http.Response, what string) ([]byte, error) {
	if resp.StatusCode != http.StatusOK {
		return nil, statusFailure(what, resp)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxManifestBytes {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a %d byte manifest, over the %d byte bound", what, resp.ContentLength, maxManifestBytes)
	}
	body, err := io.ReadAll(resp.Body)
	if errors.Is(err, errBodyTooLarge) {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a manifest over the %d byte bound", what, maxManifestBytes)
	}
	if err != nil {
		return nil, transportFailure(what, err)
	}
	return body, nil
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

// heads proves, with one round of requests in parallel (bounded), that
// the repository holds each manifest and blob for this credential: a HEAD
// of each, and for config (when not nil) a GET whose bytes must be the
// config's. It returns the config's bytes.
func (k *check) heads(ctx context.Context, manifests []digest.Digest, config *ocispec.Descriptor, blobs []ocispec.Descriptor) ([]byte, error) {
	type target struct {
		method string
		path   string
		digest digest.Digest
		accept string
	}
	var targets []target
	if config != nil {
		targets = append(targets, target{http.MethodGet, "/blobs/" + config.Digest.String(), config.Digest, ""})
	}
	for _, d := range manifests {
		targets = append(targets, target{http.MethodHead, "/manifests/" + d.String(), d, acceptManifests})
	}
	for _, b := range blobs {
		targets = append(targets, target{http.MethodHead, "/blobs/" + b.Digest.String(), b.Digest, ""})
	}
	if len(targets) > maxBlobs {
		return nil, failure(ErrUnreachable, "invalid answer", "the image needs %d blobs, over the bound of %d", len(targets), maxBlobs)
	}
	const (
		failed = iota // the zero value: an outcome never set fails closed
		present
		missing
		refused
		forged // a GET whose bytes are not the content asked for
	)
	type outcome struct {
		kind int
		err  error
	}
	outcomes := make([]outcome, len(targets))
	var configBody []byte
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(k.c.maxParallel)
	for i, t := range targets {
		g.Go(func() error {
			what := t.method + " " + k.name.repository + t.path
			resp, err := k.do(ctx, t.method, t.path, t.accept)
			switch {
			case errors.Is(err, ErrDenied):
				outcomes[i] = outcome{refused, err}
				return nil
			case err != nil:
				outcomes[i] = outcome{failed, err}
				cancel() // the answer is unreachable anyway: stop asking
				return nil
			}
			if t.method == http.MethodGet && resp.StatusCode == http.StatusOK {
				body, err := readConfig(resp, what, t.digest)
				switch {
				case errors.Is(err, ErrForged):
					outcomes[i] = outcome{forged, err}
				case err != nil:
					outcomes[i] = outcome{failed, err}
					cancel()
				default:
					configBody = body
					outcomes[i] = outcome{kind: present}
				}
				return nil
			}
			discard(resp)
			switch code := resp.StatusCode; {
			case code == http.StatusOK:
				if h := resp.Header.Get("Docker-Content-Digest"); h != "" && h != t.digest.String() {
					outcomes[i] = outcome{failed, failure(ErrUnreachable, "invalid answer", "%s: Docker-Content-Digest names %.80s", what, h)}
					cancel()
					return nil
				}
				outcomes[i] = outcome{kind: present}
			case isRedirect(code) && t.method == http.MethodHead:
				outcomes[i] = outcome{kind: present} // sent on to the storage: see checkRedirect
			case code == http.StatusNotFound:
				outcomes[i] = outcome{kind: missing}
			case code == http.StatusForbidden:
				outcomes[i] = outcome{kind: refused}
			default:
				outcomes[i] = outcome{failed, statusFailure(what, resp)}
				cancel()
			}
			return nil
		})
	}
	g.Wait()

	var absent, forgedDetail []string
	var firstFailure, cancelled error
	regLabel, epLabel := k.c.labels.registry(k.name.registry), k.c.labels.endpoint(k.ep)
	for i, o := range outcomes {
		switch o.kind {
		case present:
			k.res.BlobsChecked++
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobPresent).Inc()
		case forged:
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobForged).Inc()
			var e *Error
			if errors.As(o.err, &e) {
				forgedDetail = append(forgedDetail, e.Detail)
			}
		case missing, refused:
			how := map[int]string{missing: blobMissing, refused: blobRefused}[o.kind]
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, how).Inc()
			absent = append(absent, fmt.Sprintf("%s %s", targets[i].digest, how))
		default:
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobError).Inc()
			switch {
			case o.err == nil:
				firstFailure = failure(ErrUnreachable, "internal error", "%s %s%s: no outcome", targets[i].method, k.name.repository, targets[i].path)
			case errors.Is(o.err, context.Canceled):
				cancelled = o.err
			case firstFailure == nil:
				firstFailure = o.err
			}
		}
	}
	nAbsent := len(absent)
	if nAbsent > 10 {
		absent = append(absent[:10], "…")
	}
	if len(forgedDetail) > 0 {
		// The config's bytes are not the config: whatever else the round
		// found, the registry named an image it cannot serve. The pod reads
		// that much; the operator's detail names the registry, the
		// repository and both digests, and what else was not readable.
		detail := fmt.Sprintf("registry %s, repository %s: %s", k.name.registry, k.name.repository, strings.Join(forgedDetail, "; "))
		if len(absent) > 0 {
			detail += "; not readable either: " + strings.Join(absent, ", ")
		}
		return nil, forgery(reasonForgedConfig, "%s", detail)
	}
	if nAbsent > 0 {
		return nil, failure(ErrDenied, fmt.Sprintf("%d of %d blobs not readable in the repository", nAbsent, len(targets)),
			"in %s: %s", k.name.repository, strings.Join(absent, ", "))
	}
	if firstFailure != nil {
		return nil, firstFailure
	}
	return configBody, cancelled // nil, or the caller's context was cancelled
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
