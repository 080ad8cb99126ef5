package registry

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/platforms"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
)

// Passwords and tokens the tests look for in every error and log line.
var testUsers = map[string]string{
	"alice": "alice-SECRET-pw-7f3a",
	"bob":   "bob-SECRET-pw-91c2",
	"carol": "carol-SECRET-pw-0d55",
}

const testIdentityToken = "carol-IDENTITY-SECRET-3b8e"

// authMode is how a testRegistry authenticates.
type authMode int

const (
	authBasic  authMode = iota // htpasswd-like: Basic on every request
	authBearer                 // a token endpoint at /token, bearer tokens per scope
	authNone                   // an open registry: a mirror that checks no caller
)

// testRegistry is go-containerregistry's in-memory registry behind auth
// middleware with per-repository rules, on a loopback port. It records
// every request it answers.
type testRegistry struct {
	t     testing.TB
	srv   *httptest.Server
	host  string // 127.0.0.1:port
	store http.Handler

	mu           sync.Mutex
	mode         authMode
	readers      map[string][]string // repository -> users who can read it ("" = anyone)
	tokenRefused bool                // the token endpoint answers 401 to everyone
	hook         func(w http.ResponseWriter, r *http.Request) bool
	tokens       map[string]tokenGrant
	seen         []seenRequest
}

type tokenGrant struct {
	user  string
	repos []string
}

type seenRequest struct {
	method, path, ns, auth string // auth: "", "basic", "bearer"
	status                 int
}

func newTestRegistry(t testing.TB, mode authMode, store http.Handler) *testRegistry {
	t.Helper()
	if store == nil {
		store = ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	}
	tr := &testRegistry{t: t, store: store, mode: mode, readers: map[string][]string{}, tokens: map[string]tokenGrant{}}
	tr.srv = httptest.NewServer(tr)
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

func (tr *testRegistry) allow(repo string, users ...string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.readers[repo] = append(tr.readers[repo], users...)
}

func (tr *testRegistry) setHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.hook = h
}

func (tr *testRegistry) setMode(m authMode) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.mode = m
}

// requests returns what was asked since the last call.
func (tr *testRegistry) requests() []seenRequest {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.seen
	tr.seen = nil
	return s
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (tr *testRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		authKind, _, _ := strings.Cut(strings.ToLower(r.Header.Get("Authorization")), " ")
		tr.mu.Lock()
		tr.seen = append(tr.seen, seenRequest{method: r.Method, path: r.URL.Path, ns: r.URL.Query().Get("ns"), auth: authKind, status: sw.status})
		tr.mu.Unlock()
	}()
	tr.mu.Lock()
	hook, mode := tr.hook, tr.mode
	tr.mu.Unlock()
	if r.URL.Path == "/token" {
		tr.serveToken(sw, r)
		return
	}
	if hook != nil && hook(sw, r) {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(sw, "read-only", http.StatusMethodNotAllowed)
		return
	}
	if mode != authNone {
		repo := v2Repository(r.URL.Path)
		switch tr.authorize(r, mode, repo) {
		case http.StatusUnauthorized:
			tr.challenge(sw, mode, repo, r.Header.Get("Authorization") != "")
			return
		case http.StatusForbidden:
			http.Error(sw, `{"errors":[{"code":"DENIED","message":"no"}]}`, http.StatusForbidden)
			return
		}
	}
	tr.store.ServeHTTP(sw, r)
}

// v2Repository is the repository of /v2/<repo>/(manifests|blobs)/<ref>;
// "" for /v2/.
func v2Repository(p string) string {
	p = strings.TrimPrefix(p, "/v2/")
	for _, sep := range []string{"/manifests/", "/blobs/"} {
		if i := strings.LastIndex(p, sep); i >= 0 {
			return p[:i]
		}
	}
	return ""
}

func (tr *testRegistry) canRead(user, repo string) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Contains(tr.readers[repo], "") || (user != "" && slices.Contains(tr.readers[repo], user))
}

// authorize answers 0 (go on), 401 or 403.
func (tr *testRegistry) authorize(r *http.Request, mode authMode, repo string) int {
	h := r.Header.Get("Authorization")
	switch {
	case mode == authBasic && strings.HasPrefix(h, "Basic "):
		u, p, _ := r.BasicAuth()
		if testUsers[u] == "" || testUsers[u] != p {
			return http.StatusUnauthorized
		}
		if repo != "" && !tr.canRead(u, repo) {
			return http.StatusForbidden
		}
		return 0
	case mode == authBearer && strings.HasPrefix(h, "Bearer "):
		tr.mu.Lock()
		g, ok := tr.tokens[strings.TrimPrefix(h, "Bearer ")]
		tr.mu.Unlock()
		if !ok || (repo != "" && !slices.Contains(g.repos, repo)) {
			return http.StatusUnauthorized
		}
		return 0
	case h == "" && repo != "" && tr.canRead("", repo):
		return 0
	}
	return http.StatusUnauthorized
}

func (tr *testRegistry) challenge(w http.ResponseWriter, mode authMode, repo string, hadAuth bool) {
	if mode == authBasic {
		w.Header().Set("WWW-Authenticate", `Basic realm="test registry"`)
	} else {
		c := fmt.Sprintf(`Bearer realm=%q,service="test-registry"`, tr.srv.URL+"/token")
		if repo != "" {
			c += fmt.Sprintf(`,scope="repository:%s:pull"`, repo)
		}
		if hadAuth {
			c += `,error="insufficient_scope"`
		}
		w.Header().Set("WWW-Authenticate", c)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
}

// serveToken is a token endpoint: GET with optional basic auth, or the
// OAuth POST (password or refresh_token grant).
func (tr *testRegistry) serveToken(w http.ResponseWriter, r *http.Request) {
	tr.mu.Lock()
	refused := tr.tokenRefused
	tr.mu.Unlock()
	var user string
	var scopes []string
	switch r.Method {
	case http.MethodGet:
		if u, p, ok := r.BasicAuth(); ok {
			if testUsers[u] == "" || testUsers[u] != p {
				refused = true
			}
			user = u
		}
		scopes = r.URL.Query()["scope"]
	case http.MethodPost:
		r.ParseForm()
		switch r.PostForm.Get("grant_type") {
		case "password":
			u := r.PostForm.Get("username")
			if testUsers[u] == "" || testUsers[u] != r.PostForm.Get("password") {
				refused = true
			}
			user = u
		case "refresh_token":
			if r.PostForm.Get("refresh_token") != testIdentityToken {
				refused = true
			}
			user = "carol"
		default:
			refused = true
		}
		scopes = strings.Fields(r.PostForm.Get("scope"))
	}
	if refused {
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
		return
	}
	g := tokenGrant{user: user}
	for _, s := range scopes {
		parts := strings.Split(s, ":")
		if len(parts) == 3 && parts[0] == "repository" && tr.canRead(user, parts[1]) {
			g.repos = append(g.repos, parts[1])
		}
	}
	b := make([]byte, 16)
	rand.Read(b)
	tok := "TOKEN-" + hex.EncodeToString(b)
	tr.mu.Lock()
	tr.tokens[tok] = g
	tr.mu.Unlock()
	field := "token"
	if r.Method == http.MethodPost {
		field = "access_token"
	}
	json.NewEncoder(w).Encode(map[string]any{field: tok, "expires_in": 300})
}

// pusher writes to a store with no auth in front.
type pusher struct {
	t    testing.TB
	host string
}

func newPusher(t testing.TB, store http.Handler) pusher {
	srv := httptest.NewServer(store)
	t.Cleanup(srv.Close)
	return pusher{t: t, host: strings.TrimPrefix(srv.URL, "http://")}
}

func (p pusher) image(repoTag string, img v1.Image) {
	p.t.Helper()
	ref, err := name.ParseReference(p.host+"/"+repoTag, name.Insecure)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		p.t.Fatalf("push %s: %v", repoTag, err)
	}
}

func (p pusher) index(repoTag string, idx v1.ImageIndex) {
	p.t.Helper()
	ref, err := name.ParseReference(p.host+"/"+repoTag, name.Insecure)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		p.t.Fatalf("push %s: %v", repoTag, err)
	}
}

func randomImage(t testing.TB) v1.Image {
	t.Helper()
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func configDigest(t testing.TB, img v1.Image) digest.Digest {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

func manifestDigest(t testing.TB, d interface{ Digest() (v1.Hash, error) }) digest.Digest {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

// nodeIndex is an index with an image for this node's platform and one
// for another.
func nodeIndex(t testing.TB, node, other v1.Image) v1.ImageIndex {
	t.Helper()
	p := platforms.DefaultSpec()
	otherArch := "s390x"
	if p.Architecture == otherArch {
		otherArch = "amd64"
	}
	return mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: node, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Architecture, Variant: p.Variant}}},
	)
}

// writeHostsToml writes <dir>/<host>/hosts.toml.
func writeHostsToml(t testing.TB, dir, host, content string) {
	t.Helper()
	d := filepath.Join(dir, strings.ReplaceAll(host, ":", "_")+"_")
	if !strings.Contains(host, ":") {
		d = filepath.Join(dir, host)
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(srv.URL)
	srv.Close()
	return u.Host
}
