package records

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"
)

func TestLayers(t *testing.T) {
	t.Parallel()
	const refB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	l1, l2, l3 := digest.FromString("layer 1"), digest.FromString("layer 2"), digest.FromString("layer 3")
	open := func(t *testing.T, path string) *Store {
		t.Helper()
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}

	t.Run("a verified pull keeps the image's layers and its repository's word for each, and a reopen reads them", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		s := open(t, path)
		if err := s.RecordVerifiedPull(refA, "r.test/a", Credential{Hash: "h"}, []digest.Digest{l1, l2}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s = open(t, path)
		l, ok := s.Layers(refA)
		if !ok || !slices.Equal(l.DiffIDs, []digest.Digest{l1, l2}) || !l.Seen.Equal(t0) {
			t.Fatalf("layers %+v %v", l, ok)
		}
		for _, tc := range []struct {
			repo  string
			layer digest.Digest
			want  bool
		}{{"r.test/a", l1, true}, {"r.test/a", l2, true}, {"r.test/a", l3, false}, {"r.test/b", l1, false}, {"r.test", l1, false}} {
			if got, err := s.Vouched(tc.repo, tc.layer, ""); err != nil || got != tc.want {
				t.Errorf("Vouched(%s, %s) = %v, %v; want %v", tc.repo, tc.layer, got, err, tc.want)
			}
		}
		if h := s.LayerHolders(l1); !slices.Equal(h, []string{refA}) {
			t.Errorf("holders of l1: %v", h)
		}
	})

	t.Run("the first sighting of an image's layers stands", func(t *testing.T) {
		s := open(t, filepath.Join(t.TempDir(), "ensure.db"))
		if err := s.NoteLayers(refB, []digest.Digest{l2, l3}, t0); err != nil {
			t.Fatal(err)
		}
		if err := s.NoteLayers(refB, []digest.Digest{l1}, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordVerifiedPull(refB, "r.test/b", Credential{Node: true}, []digest.Digest{l2, l3}, "", t0.Add(2*time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		l, _ := s.Layers(refB)
		if !slices.Equal(l.DiffIDs, []digest.Digest{l2, l3}) || !l.Seen.Equal(t0) {
			t.Errorf("layers %+v, want the first sighting's", l)
		}
		if err := s.NoteLayers("not-a-digest", nil, t0); err == nil {
			t.Errorf("an image ID that is no digest was taken")
		}
	})

	t.Run("a repository's word goes with the record that gave it; the layers with the image", func(t *testing.T) {
		s := open(t, filepath.Join(t.TempDir(), "ensure.db"))
		s.RecordVerifiedPull(refA, "r.test/a", Credential{Hash: "h"}, []digest.Digest{l1}, "", t0, nil)
		s.RecordVerifiedPull(refB, "r.test/a", Credential{Hash: "h"}, []digest.Digest{l1, l2}, "", t0, nil)
		if _, err := s.Forget(refA); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.Vouched("r.test/a", l1, ""); !ok {
			t.Errorf("B's record still vouches for l1 in r.test/a")
		}
		if n, err := s.Prune(func(string) bool { return false }, t0.Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("prune: %d, %v", n, err)
		}
		if ok, _ := s.Vouched("r.test/a", l1, ""); ok {
			t.Errorf("no record is left, yet r.test/a vouches for l1")
		}
		n, err := s.ForgetLayers(func(string) bool { return false })
		if err != nil || n != 2 {
			t.Fatalf("ForgetLayers: %d, %v", n, err)
		}
		if _, ok := s.Layers(refB); ok || len(s.LayerHolders(l1)) != 0 {
			t.Errorf("the layers of images gone are still known")
		}
	})

	t.Run("the layers of an image with a record are kept while the record is", func(t *testing.T) {
		s := open(t, filepath.Join(t.TempDir(), "ensure.db"))
		s.RecordVerifiedPull(refA, "r.test/a", Credential{Hash: "h"}, []digest.Digest{l1}, "", t0, nil)
		if n, err := s.ForgetLayers(func(string) bool { return false }); err != nil || n != 0 {
			t.Fatalf("ForgetLayers: %d, %v", n, err)
		}
		if _, ok := s.Layers(refA); !ok {
			t.Errorf("the layers of a recorded image went")
		}
	})

	t.Run("an invalid diff_id is refused and nothing is written", func(t *testing.T) {
		s := open(t, filepath.Join(t.TempDir(), "ensure.db"))
		if err := s.RecordVerifiedPull(refA, "r.test/a", Credential{Hash: "h"}, []digest.Digest{"nope"}, "", t0, nil); err == nil {
			t.Fatal("an invalid diff_id was taken")
		}
		if _, err := s.Get(refA); err == nil {
			t.Errorf("a record was written")
		}
	})
}

func FuzzDecodeLayers(f *testing.F) {
	f.Add(encodeLayers(ImageLayers{DiffIDs: []digest.Digest{digest.FromString("x"), digest.FromString("y")}, Seen: t0}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeLayers(b)
		if err != nil {
			return
		}
		again, err := decodeLayers(encodeLayers(l))
		if err != nil || !slices.Equal(again.DiffIDs, l.DiffIDs) || !again.Seen.Equal(l.Seen) {
			t.Fatalf("round trip: %+v -> %+v, %v", l, again, err)
		}
	})
}
