package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// env is a registry with auth, its images, and a Checker with a log.
type env struct {
	reg      *testRegistry
	push     pusher
	img      v1.Image // team-a/app:v1, and the content of every copy
	imgID    digest.Digest
	imgMan   digest.Digest
	other    v1.Image // team-a/app:v2
	otherID  digest.Digest
	index    v1.ImageIndex // team-a/multi:v1
	indexDig digest.Digest
	hostsDir string
	logs     *bytes.Buffer
	checker  *Checker
}

func newEnv(t testing.TB, mode authMode) *env {
	t.Helper()
	e := &env{reg: newTestRegistry(t, mode, nil), hostsDir: t.TempDir(), logs: &bytes.Buffer{}}
	e.push = newPusher(t, e.reg.store)
	e.img, e.other = randomImage(t), randomImage(t)
	e.imgID, e.otherID = configDigest(t, e.img), configDigest(t, e.other)
	e.imgMan = manifestDigest(t, e.img)
	e.index = nodeIndex(t, e.img, e.other)
	e.indexDig = manifestDigest(t, e.index)
	e.push.image("team-a/app:v1", e.img)
	e.push.image("team-a/app:v2", e.other)
	e.push.index("team-a/multi:v1", e.index)
	e.push.image("team-b/app:v1", e.other)
	e.push.image("team-b/copy:v1", e.img) // served as a manifest-only copy: see manifestOnly
	e.push.image("public/app:v1", e.img)
	e.reg.allow("team-a/app", "alice", "carol")
	e.reg.allow("team-a/multi", "alice")
	e.reg.allow("team-b/app", "bob")
	e.reg.allow("team-b/copy", "bob")
	e.reg.allow("public/app", "")
	e.checker = e.newChecker(t, Options{})
	e.reg.requests()
	return e
}

func (e *env) newChecker(t testing.TB, o Options) *Checker {
	t.Helper()
	if o.HostsDir == "" {
		o.HostsDir = e.hostsDir
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) image(repoRef string) string { return e.reg.host + "/" + repoRef }

// manifestOnly makes team-b/copy a repository that serves its manifest and
// holds no blob: a copy made from a digest.
func manifestOnly(w http.ResponseWriter, r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, "/v2/team-b/copy/blobs/") {
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
		return true
	}
	return false
}

func alice() Credential { return Credential{Username: "alice", Password: testUsers["alice"]} }
func bob() Credential   { return Credential{Username: "bob", Password: testUsers["bob"]} }

// assertNoSecret fails when a password, identity token or registry token
// appears in s.
func assertNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, secret := range append([]string{testIdentityToken, "TOKEN-", "SECRET"}, testUsers["alice"], testUsers["bob"], testUsers["carol"]) {
		if strings.Contains(s, secret) {
			t.Errorf("%s holds a secret (%q): %s", what, secret, s)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode authMode
	}{{"basic auth", authBasic}, {"token auth", authBearer}} {
		t.Run(mode.name, func(t *testing.T) {
			// Each case gets a registry and a Checker of its own: no
			// remembered challenge, no cached manifest, no request of
			// another case in flight.
			for _, tc := range []struct {
				name  string
				hook  func(e *env) func(w http.ResponseWriter, r *http.Request) bool
				req   func(e *env) Request
				want  error
				check func(t *testing.T, e *env, res Result, err error)
			}{
				{
					name: "a credential that can read the repository verifies a single-manifest image and its blobs",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.ManifestDigest != e.imgMan || res.ImageManifest != e.imgMan || res.ConfigDigest != e.imgID {
							t.Errorf("got manifest %s, image manifest %s, config %s; want %s, %s, %s", res.ManifestDigest, res.ImageManifest, res.ConfigDigest, e.imgMan, e.imgMan, e.imgID)
						}
						if res.BlobsChecked != 3 || len(res.Blobs) != 3 || res.Blobs[0] != e.imgID {
							t.Errorf("got blobs %v, %d checked; want the config and 2 layers, all checked", res.Blobs, res.BlobsChecked)
						}
						// containerd tries https first at a localhost port, then http.
						if res.Registry != e.reg.host || res.Repository != "team-a/app" || res.Endpoint != "https://"+e.reg.host+"/v2" || res.Vouched || res.CredentialKind != KindBasic {
							t.Errorf("got %+v", res)
						}
					},
				},
				{
					name: "an index verifies through the manifest of this node's platform",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/multi:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.ManifestDigest != e.indexDig || res.ImageManifest != e.imgMan || res.ConfigDigest != e.imgID {
							t.Errorf("got index %s, manifest %s, config %s; want %s, %s, %s", res.ManifestDigest, res.ImageManifest, res.ConfigDigest, e.indexDig, e.imgMan, e.imgID)
						}
					},
				},
				{
					name: "a digest reference verifies",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app@" + string(e.imgMan)), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
				},
				{
					name: "a reference with a tag and a digest asks for the digest",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v2@" + string(e.imgMan)), ImageID: string(e.imgID), Credential: alice()}
					},
				},
				{
					name: "an image ID without its algorithm is taken as sha256, as the CRI does",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: e.imgID.Encoded(), Credential: alice()}
					},
				},
				{
					name: "a tag that moved to another image is ErrMoved",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v2"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					want: ErrMoved,
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.ConfigDigest != e.otherID || res.BlobsChecked != 0 {
							t.Errorf("got config %s and %d blobs checked; want %s, none checked", res.ConfigDigest, res.BlobsChecked, e.otherID)
						}
					},
				},
				{
					name: "with no image ID the reference only resolves",
					req:  func(e *env) Request { return Request{Image: e.image("team-a/app:v2"), Credential: alice()} },
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.ConfigDigest != e.otherID {
							t.Errorf("got config %s, want %s", res.ConfigDigest, e.otherID)
						}
					},
				},
				{
					name: "a credential for another repository is ErrDenied",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: bob(), Blobs: true}
					},
					want: ErrDenied,
				},
				{
					name: "a wrong password is ErrDenied",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: Credential{Username: "alice", Password: "bob-SECRET-wrong"}}
					},
					want: ErrDenied,
				},
				{
					name: "no credential on a private repository is ErrDenied",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Blobs: true}
					},
					want: ErrDenied,
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.CredentialKind != KindAnonymous {
							t.Errorf("credential kind %q, want %q", res.CredentialKind, KindAnonymous)
						}
					},
				},
				{
					name: "no credential on a public repository verifies",
					req: func(e *env) Request {
						return Request{Image: e.image("public/app:v1"), ImageID: string(e.imgID), Blobs: true}
					},
				},
				{
					name: "a tag unknown to the repository is ErrDenied",
					req:  func(e *env) Request { return Request{Image: e.image("team-a/app:nope"), Credential: alice()} },
					want: ErrDenied,
				},
				{
					name: "a manifest-only copy of another tenant's image is ErrDenied, naming how many blobs it lacks",
					hook: func(*env) func(http.ResponseWriter, *http.Request) bool { return manifestOnly },
					req: func(e *env) Request {
						return Request{Image: e.image("team-b/copy:v1"), ImageID: string(e.imgID), Credential: bob(), Blobs: true}
					},
					want: ErrDenied,
					check: func(t *testing.T, e *env, res Result, err error) {
						var re *Error
						if !errors.As(err, &re) || re.Reason != "3 of 3 blobs not readable in the repository" || !strings.Contains(re.Error(), string(e.imgID)) {
							t.Errorf("got %v (reason %q); want a short reason with the count and the digests for the operator", err, re.Reason)
						}
					},
				},
				{
					name: "without Blobs the manifest-only copy resolves: only the reference was asked",
					hook: func(*env) func(http.ResponseWriter, *http.Request) bool { return manifestOnly },
					req: func(e *env) Request {
						return Request{Image: e.image("team-b/copy:v1"), ImageID: string(e.imgID), Credential: bob()}
					},
				},
				{
					name: "a blob HEAD redirected to the registry's storage counts as present, the redirect not followed",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/blobs/") && r.Header.Get("Authorization") != "" {
								http.Redirect(w, r, "http://"+e.reg.host+"/storage/refuses-a-head", http.StatusTemporaryRedirect)
								return true
							}
							if strings.HasPrefix(r.URL.Path, "/storage/") {
								w.WriteHeader(http.StatusForbidden)
								return true
							}
							return false
						}
					},
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					check: func(t *testing.T, e *env, res Result, err error) {
						if res.BlobsChecked != 3 {
							t.Errorf("%d blobs checked, want 3", res.BlobsChecked)
						}
					},
				},
				{
					name: "a registry error (500) is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							http.Error(w, "down", http.StatusInternalServerError)
							return true
						}
					},
					req:  func(e *env) Request { return Request{Image: e.image("team-a/app:v1"), Credential: alice()} },
					want: ErrUnreachable,
				},
				{
					name: "a blob HEAD answered 503 is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if strings.Contains(r.URL.Path, "/blobs/") {
								w.WriteHeader(http.StatusServiceUnavailable)
								return true
							}
							return false
						}
					},
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					want: ErrUnreachable,
				},
				{
					name: "a registry that names another digest than its answer's is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if r.URL.Path != "/v2/team-a/app/manifests/v2" || r.Header.Get("Authorization") == "" {
								return false
							}
							rec := httptest.NewRecorder()
							e.reg.store.ServeHTTP(rec, r)
							for k, v := range rec.Header() {
								w.Header()[k] = v
							}
							w.Header().Set("Docker-Content-Digest", string(e.imgMan))
							w.WriteHeader(rec.Code)
							w.Write(rec.Body.Bytes())
							return true
						}
					},
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app:v2"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
					},
					want: ErrUnreachable,
				},
				{
					name: "an answer to a digest reference that is other content is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if strings.HasSuffix(r.URL.Path, "/manifests/"+string(e.imgMan)) && r.Header.Get("Authorization") != "" {
								b, _ := e.other.RawManifest()
								w.Header().Set("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
								w.Write(b)
								return true
							}
							return false
						}
					},
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/app@" + string(e.imgMan)), ImageID: string(e.otherID), Credential: alice()}
					},
					want: ErrUnreachable,
				},
				{
					name: "a manifest over the size bound is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if r.URL.Path == "/v2/team-a/app/manifests/v1" && r.Header.Get("Authorization") != "" {
								w.Write([]byte(`{"schemaVersion":2,"x":"`))
								w.Write(bytes.Repeat([]byte("a"), maxManifestBytes))
								return true
							}
							return false
						}
					},
					req:  func(e *env) Request { return Request{Image: e.image("team-a/app:v1"), Credential: alice()} },
					want: ErrUnreachable,
				},
				{
					name: "an answer that is no manifest is ErrUnreachable",
					hook: func(e *env) func(http.ResponseWriter, *http.Request) bool {
						return func(w http.ResponseWriter, r *http.Request) bool {
							if r.URL.Path == "/v2/team-a/app/manifests/v1" && r.Header.Get("Authorization") != "" {
								w.Write([]byte(`<html>welcome</html>`))
								return true
							}
							return false
						}
					},
					req:  func(e *env) Request { return Request{Image: e.image("team-a/app:v1"), Credential: alice()} },
					want: ErrUnreachable,
				},
				{
					name: "an index with no manifest for this node's platform is ErrMoved",
					req: func(e *env) Request {
						return Request{Image: e.image("team-a/multi:v1"), ImageID: string(e.imgID), Credential: alice(),
							Platform: &ocispec.Platform{OS: "plan9", Architecture: "mips"}}
					},
					want: ErrMoved,
				},
			} {
				t.Run(tc.name, func(t *testing.T) {
					e := newEnv(t, mode.mode)
					if tc.hook != nil {
						e.reg.setHook(tc.hook(e))
					}
					res, err := e.checker.Check(context.Background(), tc.req(e))
					t.Logf("result %+v, error: %v", res, err)
					if tc.want == nil && err != nil {
						t.Fatalf("got %v, want verified", err)
					}
					if tc.want != nil && !errors.Is(err, tc.want) {
						t.Fatalf("got %v, want %v", err, tc.want)
					}
					// A request cancelled in flight is counted, and may not
					// reach the registry.
					if seen := e.reg.requests(); res.Requests != len(seen) && !(errors.Is(err, ErrUnreachable) && res.Requests > len(seen)) {
						t.Errorf("Result.Requests = %d, the registry saw %d: %+v", res.Requests, len(seen), seen)
					}
					if err != nil {
						assertNoSecret(t, "the error", err.Error())
					}
					assertNoSecret(t, "the log", e.logs.String())
					if tc.check != nil {
						tc.check(t, e, res, err)
					}
				})
			}
		})
	}
}

func TestCheckRemembersTheChallenge(t *testing.T) {
	for _, tc := range []struct {
		name                string
		mode                authMode
		first, second, auth int // requests of each check; with auth: the token requests
	}{
		// GET 401, GET, 3 HEAD; then GET, 3 HEAD.
		{name: "basic auth: a second credential's check makes no 401 round", mode: authBasic, first: 5, second: 4},
		// GET 401, POST token, GET, 3 HEAD; then POST token, GET, 3 HEAD.
		{name: "token auth: a second credential's check makes no 401 round", mode: authBearer, first: 6, second: 5, auth: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.mode)
			req := Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
			res, err := e.checker.Check(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if seen := e.reg.requests(); res.Requests != tc.first || len(seen) != tc.first {
				t.Errorf("first check: %d requests (the registry saw %d), want %d: %+v", res.Requests, len(seen), tc.first, seen)
			}
			req.Credential = Credential{Username: "carol", Password: testUsers["carol"]}
			res, err = e.checker.Check(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			seen := e.reg.requests()
			if res.Requests != tc.second || len(seen) != tc.second {
				t.Errorf("second check: %d requests (the registry saw %d), want %d: %+v", res.Requests, len(seen), tc.second, seen)
			}
			tokens := 0
			for _, s := range seen {
				if s.status == http.StatusUnauthorized {
					t.Errorf("second check got a 401: %+v", s)
				}
				if s.path == "/token" {
					tokens++
				}
			}
			if tokens != tc.auth {
				t.Errorf("second check made %d token requests, want %d", tokens, tc.auth)
			}
		})
	}
}

func TestCheckNeverSharesATokenAcrossCredentials(t *testing.T) {
	e := newEnv(t, authBearer)
	req := Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
	if _, err := e.checker.Check(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	// bob's check right after alice's: alice's token would read team-a/app.
	req.Credential = bob()
	if _, err := e.checker.Check(context.Background(), req); !errors.Is(err, ErrDenied) {
		t.Fatalf("got %v, want ErrDenied", err)
	}
	req.Credential = Credential{}
	if _, err := e.checker.Check(context.Background(), req); !errors.Is(err, ErrDenied) {
		t.Fatalf("anonymous: got %v, want ErrDenied", err)
	}
}

func TestCheckLearnsAStaleChallengeAndRetriesOnce(t *testing.T) {
	e := newEnv(t, authBasic)
	req := Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice()}
	if _, err := e.checker.Check(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	e.reg.setMode(authBearer) // the registry moved to a token server
	e.reg.requests()
	res, err := e.checker.Check(context.Background(), req)
	if err != nil {
		t.Fatalf("after the registry's challenge changed: %v", err)
	}
	// GET with basic 401, POST token, GET.
	if seen := e.reg.requests(); res.Requests != 3 || len(seen) != 3 {
		t.Errorf("%d requests (the registry saw %d), want 3: %+v", res.Requests, len(seen), seen)
	}
}

func TestCheckTokenFlow(t *testing.T) {
	e := newEnv(t, authBearer)
	// A registry token, as a client that ran the token flow itself holds it.
	tokResp, err := http.Get(e.reg.srv.URL + "/token?service=test-registry&scope=repository:team-a/app:pull")
	if err != nil {
		t.Fatal(err)
	}
	tokResp.Body.Close()
	registryToken := ""
	e.reg.mu.Lock()
	for tok := range e.reg.tokens {
		registryToken = tok
	}
	e.reg.tokens[registryToken] = tokenGrant{user: "alice", repos: []string{"team-a/app"}}
	e.reg.mu.Unlock()

	for _, tc := range []struct {
		name    string
		refused bool
		cred    Credential
		want    error
	}{
		{name: "a token endpoint that refuses the credential is ErrDenied", refused: true, cred: alice(), want: ErrDenied},
		{name: "an identity token is exchanged for a token and verifies", cred: Credential{IdentityToken: testIdentityToken}},
		{name: "a wrong identity token is ErrDenied", cred: Credential{IdentityToken: "SECRET-not-it"}, want: ErrDenied},
		{name: "a registry token is sent as it is and verifies", cred: Credential{RegistryToken: registryToken}},
		{name: "a registry token for another repository is ErrDenied", cred: Credential{RegistryToken: registryToken}, want: ErrDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.reg.mu.Lock()
			e.reg.tokenRefused = tc.refused
			e.reg.mu.Unlock()
			e.logs.Reset()
			image := e.image("team-a/app:v1")
			if strings.Contains(tc.name, "another repository") {
				image = e.image("public/app:v1")
				e.reg.mu.Lock()
				e.reg.readers["public/app"] = []string{"bob"}
				e.reg.mu.Unlock()
				defer e.reg.allow("public/app", "")
			}
			_, err := e.checker.Check(context.Background(), Request{Image: image, ImageID: string(e.imgID), Credential: tc.cred, Blobs: true})
			if (tc.want == nil && err != nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if err != nil {
				msg := strings.ReplaceAll(err.Error(), registryToken, "SECRET")
				assertNoSecret(t, "the error", msg)
			}
			assertNoSecret(t, "the log", strings.ReplaceAll(e.logs.String(), registryToken, "SECRET"))
		})
	}
}

func TestCheckWhenTheRegistryCannotBeAsked(t *testing.T) {
	e := newEnv(t, authBasic)
	down := closedPort(t)
	hang := newTestRegistry(t, authNone, nil)
	hang.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done() // never answers
		return true
	})
	checker := e.newChecker(t, Options{Timeout: 300 * time.Millisecond})
	for _, tc := range []struct {
		name, image string
		also        error
	}{
		{name: "a registry that is down is ErrUnreachable", image: down + "/team-a/app:v1"},
		{name: "a registry that does not answer in time is ErrUnreachable", image: hang.host + "/team-a/app:v1", also: context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := checker.Check(context.Background(), Request{Image: tc.image, Credential: alice(), Blobs: true})
			if !errors.Is(err, ErrUnreachable) || (tc.also != nil && !errors.Is(err, tc.also)) {
				t.Fatalf("got %v, want ErrUnreachable %v", err, tc.also)
			}
			if !strings.Contains(err.Error(), res.Endpoint) || res.Endpoint == "" {
				t.Errorf("the error %q does not name the endpoint %q", err, res.Endpoint)
			}
			assertNoSecret(t, "the error", err.Error())
		})
	}
}

func TestCheckNeverAsksAMirrorOfHostsToml(t *testing.T) {
	e := newEnv(t, authBasic)
	mirror := newTestRegistry(t, authNone, e.reg.store) // serves everything to anyone
	writeHostsToml(t, e.hostsDir, "private.test", fmt.Sprintf(`server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, e.reg.host, mirror.host))
	image := "private.test/team-a/app:v1"
	if _, err := e.checker.Check(context.Background(), Request{Image: image, ImageID: string(e.imgID), Blobs: true}); !errors.Is(err, ErrDenied) {
		t.Errorf("no credential: got %v, want ErrDenied from the registry's server", err)
	}
	res, err := e.checker.Check(context.Background(), Request{Image: image, ImageID: string(e.imgID), Credential: alice(), Blobs: true})
	if err != nil {
		t.Fatalf("alice: %v", err)
	}
	if res.Endpoint != "http://"+e.reg.host+"/v2" || res.Vouched || res.Registry != "private.test" {
		t.Errorf("got endpoint %s (vouched %v) for %s", res.Endpoint, res.Vouched, res.Registry)
	}
	if seen := mirror.requests(); len(seen) != 0 {
		t.Errorf("the mirror was asked: %+v", seen)
	}
	for _, s := range e.reg.requests() {
		if s.ns != "private.test" {
			t.Errorf("request %s %s without containerd's ns=private.test", s.method, s.path)
		}
	}
}

func TestCheckAsksAVouchedMirrorInsteadOfTheServer(t *testing.T) {
	e := newEnv(t, authBasic)
	// A mirror that enforces the registry's own authorization: the same
	// rules over the same content.
	mirror := newTestRegistry(t, authBasic, e.reg.store)
	mirror.readers = e.reg.readers
	unlisted := newTestRegistry(t, authBasic, e.reg.store)
	unlisted.readers = e.reg.readers
	writeHostsToml(t, e.hostsDir, "private.test", fmt.Sprintf(`server = "http://%s"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, closedPort(t), mirror.host))
	writeHostsToml(t, e.hostsDir, "other.test", fmt.Sprintf(`server = "http://%s"`, closedPort(t)))
	checker := e.newChecker(t, Options{Vouched: []VouchedMirror{
		{Registry: "private.test", Endpoint: "http://" + mirror.host},
		{Registry: "other.test", Endpoint: "http://" + unlisted.host + "/"},
	}})
	for _, tc := range []struct {
		name   string
		image  string
		mirror *testRegistry
	}{
		{name: "a vouched mirror listed in hosts.toml is asked with its entry", image: "private.test/team-a/app:v1", mirror: mirror},
		{name: "a vouched mirror not in hosts.toml is asked", image: "other.test/team-a/app:v1", mirror: unlisted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := checker.Check(context.Background(), Request{Image: tc.image, ImageID: string(e.imgID), Credential: alice(), Blobs: true})
			if err != nil {
				t.Fatalf("alice: %v", err)
			}
			if !res.Vouched || res.Endpoint != "http://"+tc.mirror.host+"/v2" {
				t.Errorf("got endpoint %s, vouched %v; want the mirror, vouched", res.Endpoint, res.Vouched)
			}
			if _, err := checker.Check(context.Background(), Request{Image: tc.image, ImageID: string(e.imgID), Credential: bob(), Blobs: true}); !errors.Is(err, ErrDenied) {
				t.Errorf("bob: got %v, want ErrDenied from the mirror", err)
			}
			// The metrics tell the mirror's answers from the server's.
			if n := testutil.ToFloat64(checker.metrics.checks.WithLabelValues(res.Registry, "http://"+tc.mirror.host, resultVerified)); n != 1 {
				t.Errorf("checks verified by the mirror's endpoint: %v, want 1", n)
			}
			seen := tc.mirror.requests()
			if len(seen) == 0 || seen[0].ns != res.Registry {
				t.Errorf("the mirror saw %+v, want requests with ns=%s", seen, res.Registry)
			}
		})
	}
	if err := checker.Reload(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := checker.Check(context.Background(), Request{Image: "private.test/team-a/app:v1", Credential: alice()}); !errors.Is(err, ErrUnreachable) {
		t.Errorf("after Reload without the mirror: got %v, want ErrUnreachable from the registry's server", err)
	}
}

func TestCheckCountsEveryMissingBlobAndListsTenForTheOperator(t *testing.T) {
	e := newEnv(t, authBasic)
	img, err := random.Image(64, 12)
	if err != nil {
		t.Fatal(err)
	}
	e.push.image("team-b/copy:big", img)
	e.reg.setHook(manifestOnly)
	_, err = e.checker.Check(context.Background(), Request{Image: e.image("team-b/copy:big"), Credential: bob(), Blobs: true})
	var re *Error
	if !errors.As(err, &re) || !errors.Is(err, ErrDenied) || re.Reason != "13 of 13 blobs not readable in the repository" {
		t.Fatalf("got %v, want ErrDenied for 13 of 13", err)
	}
	if n := strings.Count(re.Detail, "sha256:"); n != 10 || !strings.HasSuffix(re.Detail, "…") {
		t.Errorf("the detail lists %d digests: %s", n, re.Detail)
	}
}
