package kubeletrecords

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// withPreloaded adds the kubelet's preloaded record files (testdata
// fixtures, by image ID) to dir.
func withPreloaded(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	os.MkdirAll(filepath.Join(dir, PreloadedDir), 0o700)
	for id, fixture := range files {
		data, err := os.ReadFile(filepath.Join("testdata", fixture))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, PreloadedDir, FileName(id)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func openStore(t *testing.T) *records.Store {
	t.Helper()
	s, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestReadPreloaded(t *testing.T) {
	t.Run("the kubelet's files are read, by repository, and a directory it has not made is empty", func(t *testing.T) {
		dir := withPreloaded(t, t.TempDir(), map[string]string{idA: "kubelet-preloaded.json"})
		os.WriteFile(filepath.Join(dir, PreloadedDir, FileName(idB)+".tmp"), []byte("half"), 0o600)
		pre, skipped, err := ReadPreloaded(dir)
		if err != nil || len(pre) != 1 || skipped != 1 {
			t.Fatalf("%d records, %d skipped, %v", len(pre), skipped, err)
		}
		if got := pre[0].Names(); pre[0].ImageRef != idA || !slices.Equal(got, []string{"registry.example/preloaded/app", "registry.example/team-a/app"}) {
			t.Errorf("read %s: %q", pre[0].ImageRef, got)
		}
		if pre, _, err := ReadPreloaded(t.TempDir()); err != nil || pre != nil {
			t.Errorf("no directory: %v, %v", pre, err)
		}
	})
	t.Run("a file under another image's name is an error naming it", func(t *testing.T) {
		dir := withPreloaded(t, t.TempDir(), map[string]string{idB: "kubelet-preloaded.json"})
		if _, _, err := ReadPreloaded(dir); err == nil || !strings.Contains(err.Error(), FileName(idB)) {
			t.Errorf("got %v", err)
		}
	})
}

// The proxy's preloaded record of idA: a tag of its own repository (A
// pulled another tag of it with credentials), and another repository.
var ours = &PreloadedRecord{ImageRef: idA, LastUpdatedTime: metav1.NewTime(time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)),
	ObservedImages: map[string]records.PreloadedImage{
		"registry.example/team-a/app:node":                  {},
		"registry.example/team-a/app@sha256:" + repeat("9"): {},
		"registry.example/base/app:node":                    {},
	}}

func repeat(s string) string { return strings.Repeat(s, 64) }

func TestWritePreloaded(t *testing.T) {
	rec := &Record{ImageRef: idA, CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{"registry.example/team-a/app": {}}}

	t.Run("by repository, less those the image was pulled as: the kubelet cannot tell their tags apart", func(t *testing.T) {
		dir := t.TempDir()
		rep, err := Write(dir, []*Record{rec}, []*PreloadedRecord{ours}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Preloaded != 1 || rep.PreloadedLeftOut != 2 {
			t.Errorf("report %+v", rep)
		}
		data, err := os.ReadFile(filepath.Join(dir, PreloadedDir, FileName(idA)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodePreloaded(data)
		if err != nil {
			t.Fatal(err)
		}
		if names := got.Names(); !slices.Equal(names, []string{"registry.example/base/app"}) || !got.LastUpdatedTime.Equal(&ours.LastUpdatedTime) {
			t.Errorf("written: %s", data)
		}
		if fi, _ := os.Stat(filepath.Join(dir, PreloadedDir)); fi == nil || fi.Mode() != 0o700|os.ModeDir {
			t.Errorf("directory %v", fi)
		}
		if len(ours.ObservedImages) != 3 {
			t.Errorf("Write changed the record it was given")
		}
	})
	t.Run("merged with the kubelet's own file; one that does not decode is not overwritten", func(t *testing.T) {
		dir := withPreloaded(t, t.TempDir(), map[string]string{idA: "kubelet-preloaded.json"})
		if _, err := Write(dir, []*Record{rec}, []*PreloadedRecord{ours}, nil); err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(filepath.Join(dir, PreloadedDir, FileName(idA)))
		got, err := DecodePreloaded(data)
		if err != nil || !slices.Equal(got.Names(), []string{"registry.example/base/app", "registry.example/preloaded/app", "registry.example/team-a/app"}) {
			t.Errorf("merged: %s, %v", data, err)
		}
		path := filepath.Join(dir, PreloadedDir, FileName(idA))
		os.WriteFile(path, []byte("{broken"), 0o600)
		if _, err := Write(dir, []*Record{rec}, []*PreloadedRecord{ours}, nil); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("got %v", err)
		}
	})
}

// TestImportPreloaded: the kubelet's observed repositories become the
// names the image is listed under in them, where the image was not pulled
// as them; a repository it was pulled as, or an image with no record
// anywhere, is left out.
func TestImportPreloaded(t *testing.T) {
	dir := withPreloaded(t, kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json"}, nil),
		map[string]string{idA: "kubelet-preloaded.json", idB: "kubelet-preloaded-no-record.json"})
	onNode := node{
		idA: {"registry.example/preloaded/app:node", "registry.example/preloaded/app@sha256:" + repeat("8"), "registry.example/team-a/app:v1", idA},
		idB: {"registry.example/other/app:1"},
	}
	read := func(t *testing.T) ([]*Record, []*PreloadedRecord) {
		recs, _, _, err := Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		pre, _, err := ReadPreloaded(dir)
		if err != nil {
			t.Fatal(err)
		}
		return recs, pre
	}

	t.Run("by the names listed now; the image is free by them and by ID", func(t *testing.T) {
		store := openStore(t)
		recs, pre := read(t)
		rep, err := Import(store, recs, pre, nil, onNode.images)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"registry.example/preloaded/app:node", "registry.example/preloaded/app@sha256:" + repeat("8")}
		if got := store.Preloaded(idA); !slices.Equal(got, want) {
			t.Errorf("preloaded names %q, want %q", got, want)
		}
		if rep.PreloadedNames != 2 || rep.PreloadedLeftOut != 2 { // team-a/app (pulled by the kubelet), other/app (no record)
			t.Errorf("report %+v", rep)
		}
		if got := store.Preloaded(idB); got != nil {
			t.Errorf("an image with no record got %q", got)
		}
		policy, _ := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
		decider, err := ensure.NewDecider(store, policy, onNode, ensure.DeciderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for image, verify := range map[string]bool{"registry.example/preloaded/app:node": false, idA: false, "registry.example/team-a/app:v1": true} {
			if e, err := decider.Explain(context.Background(), image, ""); err != nil || e.NeedsVerification != verify {
				t.Errorf("%s: %+v, %v; want verification %v", image, e, err, verify)
			}
		}
	})
	t.Run("when the runtime cannot be asked, the records come in and the names stay out", func(t *testing.T) {
		store := openStore(t)
		recs, pre := read(t)
		rep, err := Import(store, recs, pre, nil, noRuntime)
		if err != nil || rep.PreloadedUnasked == nil || rep.PreloadedNames != 0 {
			t.Fatalf("report %+v, %v", rep, err)
		}
		if _, err := store.Get(idA); err != nil || store.Preloaded(idA) != nil {
			t.Errorf("record %v, names %q", err, store.Preloaded(idA))
		}
	})
}

// TestExportImportRoundTrip: the proxy's preloaded names, exported in the
// kubelet's format and imported again, come back by repository where the
// kubelet's format can say them: another repository's names do; a tag of
// a repository the image was also pulled as with credentials cannot cross
// (the kubelet keys repositories, and forgets one at its first pull), and
// needs verification afterwards rather than hand out the puller's tag.
func TestExportImportRoundTrip(t *testing.T) {
	from := openStore(t)
	names := []string{"registry.example/team-a/app:node", "registry.example/base/app:node"}
	onNode := node{idA: append(slices.Clone(names), "registry.example/team-a/app:v1")}
	alice := records.Credential{Hash: from.HashAuth(records.Auth{Username: "alice", Password: "a"})}
	if err := from.RecordPull(idA, "registry.example/team-a/app", alice, "", time.Now(), names); err != nil {
		t.Fatal(err)
	}
	recs, _, _ := from.List()
	pre, _, _ := from.PreloadedRecords()
	dir := t.TempDir()
	if _, err := Write(dir, recs, pre, nil); err != nil {
		t.Fatal(err)
	}
	to := openStore(t)
	back, _, _, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	backPre, _, err := ReadPreloaded(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Import(to, back, backPre, nil, onNode.images); err != nil {
		t.Fatal(err)
	}
	if got := to.Preloaded(idA); !slices.Equal(got, []string{"registry.example/base/app:node"}) {
		t.Errorf("after the round trip: %q, want the other repository's name only", got)
	}
}
