package testkit

import (
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestWritePlugin(t *testing.T) {
	t.Parallel()
	path := WritePlugin(t, t.TempDir(), "echo", `echo "ran with $1"`)
	out, err := exec.Command(path, "an argument").Output()
	if err != nil || string(out) != "ran with an argument\n" {
		t.Errorf("the plugin printed %q (%v)", out, err)
	}
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		lying       bool
		missingHEAD int
	}{
		{"an honest registry says a blob it lacks is missing", false, http.StatusNotFound},
		{"a lying registry says a blob it lacks exists", true, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := NewRegistry(t)
			if tc.lying {
				r = NewLyingRegistry(t)
			}
			d := r.Blob("b/app", []byte("layer"))
			ref := r.Manifest(t, "b/app", "v1", "application/vnd.oci.image.manifest.v1+json", map[string]string{"config": d.String()})
			if want := r.Host + "/b/app:v1"; ref != want {
				t.Errorf("reference %s, want %s", ref, want)
			}
			status := func(method, path string) (int, http.Header) {
				t.Helper()
				req, _ := http.NewRequest(method, "http://"+r.Host+path, nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode, resp.Header
			}
			if code, h := status(http.MethodHead, "/v2/b/app/blobs/"+d.String()); code != http.StatusOK || h.Get("Docker-Content-Digest") != d.String() || h.Get("Content-Length") != "5" {
				t.Errorf("HEAD of a blob it holds: %d %v", code, h)
			}
			if code, _ := status(http.MethodHead, "/v2/b/app/blobs/sha256:"+strings.Repeat("0", 64)); code != tc.missingHEAD {
				t.Errorf("HEAD of a blob it lacks: %d, want %d", code, tc.missingHEAD)
			}
			if code, _ := status(http.MethodGet, "/v2/b/app/blobs/sha256:"+strings.Repeat("0", 64)); code != http.StatusNotFound {
				t.Errorf("GET of a blob it lacks: %d, want 404", code)
			}
			if code, _ := status(http.MethodGet, "/v2/b/app/manifests/v1"); code != http.StatusOK {
				t.Errorf("GET of the manifest by tag: %d", code)
			}
			man, _ := r.Content("/v2/b/app/manifests/v1")
			if got := r.Served(); got != int64(len(man)) {
				t.Errorf("served %d bytes, want the manifest's %d", got, len(man))
			}
			if got := r.Fetched(); len(got) != 2 || got[1] != "/v2/b/app/manifests/v1" {
				t.Errorf("fetched %v, want the missing blob and the manifest", got)
			}
			if got, fetched := r.Served(), r.Fetched(); got != 0 || fetched != nil {
				t.Errorf("after a read: served %d, fetched %v; want nothing", got, fetched)
			}
		})
	}
}

// TestOnlyTestsImportTestkit: no product code imports this package, so
// no test double reaches a binary.
func TestOnlyTestsImportTestkit(t *testing.T) {
	t.Parallel()
	const self = "github.com/cri-image-proxy/cri-image-proxy/test/testkit"
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the module's root is not %s: %v", root, err)
	}
	fset := token.NewFileSet()
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == self || strings.HasPrefix(p, self+"/") {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s imports %s: product code must not carry test helpers", rel, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Errorf("only %d Go files read under %s: the walk missed the tree", checked, root)
	}
}
