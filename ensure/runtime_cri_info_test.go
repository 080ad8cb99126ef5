package ensure

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

// TestTheLayersOfAVerboseImageStatus reads the diff_ids from the verbose
// ImageStatus info of each runtime, as captured from it (testdata), and
// refuses what is not such an info.
func TestTheLayersOfAVerboseImageStatus(t *testing.T) {
	files, err := filepath.Glob("testdata/verbose-info-*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no captured infos: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f)+" gives its image's diff_ids", func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := diffIDsOfInfo(strings.TrimSpace(string(b)))
			if !ok || len(got) == 0 {
				t.Fatalf("no layers read from %s", f)
			}
			for _, d := range got {
				if d.Validate() != nil {
					t.Errorf("invalid diff_id %q", d)
				}
			}
		})
	}
	for _, tc := range []struct {
		name, info string
		want       []digest.Digest
		ok         bool
	}{
		{"no info at all (a runtime that gives none) says nothing", "", nil, false},
		{"info without an image config (CRI-O's kind) says nothing", `{"labels":{},"imageSpec":null}`, nil, false},
		{"an image config of another kind of root file system says nothing", `{"imageSpec":{"rootfs":{"type":"other","diff_ids":[]}}}`, nil, false},
		{"an invalid diff_id says nothing", `{"imageSpec":{"rootfs":{"type":"layers","diff_ids":["sha256:nothex"]}}}`, nil, false},
		{"garbage says nothing", `{"imageSpec":`, nil, false},
		{"an image of no layers has none", `{"imageSpec":{"rootfs":{"type":"layers","diff_ids":[]}}}`, []digest.Digest{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := diffIDsOfInfo(tc.info)
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Errorf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzDiffIDsOfInfo(f *testing.F) {
	for _, s := range []string{`{"imageSpec":{"rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("a", 64) + `"]}}}`, `{}`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, info string) {
		got, ok := diffIDsOfInfo(info)
		if !ok {
			return
		}
		for _, d := range got {
			if d.Validate() != nil {
				t.Fatalf("an invalid diff_id %q was taken", d)
			}
		}
	})
}
