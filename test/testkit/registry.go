package testkit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// Registry is an OCI distribution server on 127.0.0.1, as a tenant could
// run for itself: it serves by GET and HEAD exactly the bytes the test put
// (manifests and blobs, by path, whatever the repository), answers 404 for
// the rest, and checks no credential. A lying one (NewLyingRegistry)
// answers 200 to a HEAD of anything it does not hold, as a registry that
// claims every blob it is asked about.
type Registry struct {
	// Host is its address, 127.0.0.1:port: the registry of an image
	// reference.
	Host string
	lies bool

	mu       sync.Mutex
	content  map[string][]byte // "/v2/<repo>/manifests/<ref>", "/v2/<repo>/blobs/<digest>"
	types    map[string]string
	gets     []string // paths asked for by GET since Fetched
	getBytes int64    // bytes served by GET since Served
}

// NewRegistry starts an honest Registry, stopped when the test ends.
func NewRegistry(t testing.TB) *Registry { return newRegistry(t, false) }

// NewLyingRegistry starts a lying Registry, stopped when the test ends.
func NewLyingRegistry(t testing.TB) *Registry { return newRegistry(t, true) }

func newRegistry(t testing.TB, lies bool) *Registry {
	t.Helper()
	r := &Registry{lies: lies, content: map[string][]byte{}, types: map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *Registry) serve(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	b, ok := r.content[req.URL.Path]
	mt := r.types[req.URL.Path]
	if req.Method == http.MethodGet {
		r.gets = append(r.gets, req.URL.Path)
		if ok {
			r.getBytes += int64(len(b))
		}
	}
	r.mu.Unlock()
	switch {
	case req.URL.Path == "/v2/":
	case !ok && req.Method == http.MethodHead && r.lies:
		// The lie: whatever is asked for "exists".
		w.Header().Set("Content-Length", "1")
	case !ok:
		http.NotFound(w, req)
	default:
		w.Header().Set("Content-Type", mt)
		w.Header().Set("Docker-Content-Digest", digest.FromBytes(b).String())
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		if req.Method == http.MethodGet {
			w.Write(b)
		}
	}
}

// Put serves b, of mediaType, at /v2/repo/kind/ref (kind: manifests or
// blobs).
func (r *Registry) Put(repo, kind, ref, mediaType string, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := "/v2/" + repo + "/" + kind + "/" + ref
	r.content[p], r.types[p] = b, mediaType
}

// Blob serves b as a blob of repo and returns its digest.
func (r *Registry) Blob(repo string, b []byte) digest.Digest {
	d := digest.FromBytes(b)
	r.Put(repo, "blobs", d.String(), "application/octet-stream", b)
	return d
}

// Manifest serves m, of mediaType, under repo:tag and its digest, and
// returns the reference by tag. m is the manifest's bytes, or a value
// encoded as JSON.
func (r *Registry) Manifest(t testing.TB, repo, tag, mediaType string, m any) string {
	t.Helper()
	b, ok := m.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
	}
	r.Put(repo, "manifests", tag, mediaType, b)
	r.Put(repo, "manifests", digest.FromBytes(b).String(), mediaType, b)
	return r.Host + "/" + repo + ":" + tag
}

// Content returns what is served at path (/v2/...).
func (r *Registry) Content(path string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.content[path]
	return b, ok
}

// Fetched returns the paths asked for by GET since the last call.
func (r *Registry) Fetched() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.gets
	r.gets = nil
	return g
}

// Served returns the bytes served by GET since the last call.
func (r *Registry) Served() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.getBytes
	r.getBytes = 0
	return n
}
