package records

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

const refB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

// TestPreloadedNames: the names an image was listed under before its first
// recorded pull are kept with that record, in the same write, survive a
// reopen, and go with the record; a later pull adds none.
func TestPreloadedNames(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ensure.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	alice := Credential{Hash: s.HashAuth(Auth{Username: "alice", Password: "a"})}
	before := []string{"r.test/team/base:node", "r.test/other/base:1", "r.test/other/base:1", "not a name!", "sha256:" + strings.Repeat("c", 64)}
	want := []string{"r.test/other/base:1", "r.test/team/base:node"}

	if err := s.RecordPull(refA, "r.test/team/base", alice, "", t0, before); err != nil {
		t.Fatal(err)
	}
	if got := s.Preloaded(refA); !slices.Equal(got, want) {
		t.Errorf("after the first record: %q, want %q", got, want)
	}
	if err := s.RecordPull(refA, "r.test/team/base", Credential{Hash: "h2"}, "", t0, []string{"r.test/team/base:v1"}); err != nil {
		t.Fatal(err)
	}
	if got := s.Preloaded(refA); !slices.Equal(got, want) {
		t.Errorf("a second pull's names were taken: %q", got)
	}
	if err := s.RecordPull(refB, "r.test/app", alice, "", t0, nil); err != nil {
		t.Fatal(err)
	}
	if got := s.Preloaded(refB); got != nil {
		t.Errorf("an image that came through the proxy first has preloaded names %q", got)
	}

	t.Run("they survive a restart, in the kubelet's record format", func(t *testing.T) {
		s.Close()
		if s, err = Open(path, Options{ReadOnly: true}); err != nil {
			t.Fatal(err)
		}
		if got := s.Preloaded(refA); !slices.Equal(got, want) {
			t.Errorf("after a reopen: %q", got)
		}
		recs, bad, err := s.PreloadedRecords()
		if err != nil || len(bad) > 0 || len(recs) != 1 {
			t.Fatalf("%d records, undecoded %v, %v", len(recs), bad, err)
		}
		data, _ := json.Marshal(recs[0])
		var raw map[string]any
		json.Unmarshal(data, &raw)
		if raw["kind"] != "ImagePreloadedRecord" || raw["apiVersion"] != "kubelet.config.k8s.io/v1beta1" || raw["imageRef"] != refA || raw["lastUpdatedTime"] == nil {
			t.Errorf("stored as %s", data)
		}
		s.Close()
		if s, err = Open(path, Options{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("revoking the image forgets them with its credentials", func(t *testing.T) {
		if ok, err := s.RevokeImage(refA, t0); !ok || err != nil {
			t.Fatalf("RevokeImage = %v, %v", ok, err)
		}
		if got := s.Preloaded(refA); got != nil {
			t.Errorf("after a revoke: %q", got)
		}
		if r, _ := s.Get(refA); len(r.CredentialMapping["r.test/team/base"].KubernetesSecrets) != 0 {
			t.Errorf("the revoke kept credentials: %+v", r.CredentialMapping)
		}
	})

	t.Run("forget and prune take them with the record", func(t *testing.T) {
		for _, ref := range []string{refA, refB} {
			s.Forget(ref)
		}
		s.RecordPull(refA, "r.test/team/base", alice, "", t0, before)
		s.RecordPull(refB, "r.test/team/base", alice, "", t0, before)
		if ok, err := s.Forget(refA); !ok || err != nil {
			t.Fatalf("Forget = %v, %v", ok, err)
		}
		if n, err := s.Prune(func(string) bool { return false }, t0.Add(time.Hour)); n != 1 || err != nil {
			t.Fatalf("Prune = %d, %v", n, err)
		}
		for _, ref := range []string{refA, refB} {
			if got := s.Preloaded(ref); got != nil {
				t.Errorf("%s: %q outlived the record", ref, got)
			}
		}
		if recs, _, _ := s.PreloadedRecords(); len(recs) != 0 {
			t.Errorf("%d preloaded records left in the file", len(recs))
		}
	})

	t.Run("put merges names, only beside a record of the image", func(t *testing.T) {
		s.RecordPull(refA, "r.test/team/base", alice, "", t0, []string{"r.test/team/base:node"})
		pre := []*PreloadedRecord{
			{ImageRef: refA, ObservedImages: map[string]PreloadedImage{"r.test/x/y:1": {}}},
			{ImageRef: refB, ObservedImages: map[string]PreloadedImage{"r.test/x/y:2": {}}},
		}
		if err := s.PutRecordsPreloaded(nil, pre); err != nil {
			t.Fatal(err)
		}
		if got := s.Preloaded(refA); !slices.Equal(got, []string{"r.test/team/base:node", "r.test/x/y:1"}) {
			t.Errorf("merged: %q", got)
		}
		if got := s.Preloaded(refB); got != nil {
			t.Errorf("kept for an image with no record: %q", got)
		}
	})

	t.Run("one that does not decode holds no name", func(t *testing.T) {
		if err := s.db.Update(func(tx *bolt.Tx) error {
			return preloadedBucket(tx).Put([]byte(refB), []byte("{garbage"))
		}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err = Open(path, Options{}); err != nil {
			t.Fatal(err)
		}
		if got := s.Preloaded(refB); got != nil {
			t.Errorf("names from an undecodable record: %q", got)
		}
		if _, bad, _ := s.PreloadedRecords(); !slices.Equal(bad, []string{refB}) {
			t.Errorf("undecoded %v", bad)
		}
	})
}

// TestPreloadedName is the key of a name: as the runtime resolves it.
func TestPreloadedName(t *testing.T) {
	t.Parallel()
	d := "sha256:" + strings.Repeat("e", 64)
	for in, want := range map[string]string{
		"r.test/team/base:node":             "r.test/team/base:node",
		"r.test/team/base":                  "r.test/team/base:latest",
		"r.test/team/base:node@" + d:        "r.test/team/base@" + d,
		"busybox":                           "docker.io/library/busybox:latest",
		"sha256:" + strings.Repeat("1", 64): "",
	} {
		if got, ok := PreloadedName(in); got != want || ok != (want != "") {
			t.Errorf("PreloadedName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// FuzzDecodePreloaded: a stored value never panics the decoder; what
// decodes belongs to its key and encodes back to the same names.
func FuzzDecodePreloaded(f *testing.F) {
	f.Add([]byte(refA), []byte(`{"kind":"ImagePreloadedRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-11-22T00:00:00Z","imageRef":"`+refA+`","observedImages":{"r.test/team/base:node":{}}}`))
	f.Add([]byte(refA), []byte(`{"imageRef":"x","observedImages":{"a":{"b":1}}}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		r, err := decodePreloaded(key, value)
		if err != nil {
			return
		}
		if r.ImageRef != string(key) {
			t.Fatalf("decoded a record of %q under %q", r.ImageRef, key)
		}
		data, err := encodePreloaded(r)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodePreloaded(key, data)
		if err != nil || !slices.Equal(again.Names(), r.Names()) {
			t.Fatalf("re-encoded: %v, %v", again, err)
		}
	})
}
