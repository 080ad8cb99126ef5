package ensuretest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// Image IDs for tests.
const (
	RefA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	RefB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

// StoreConformance checks that a RecordStore behaves as the guard needs.
// newStore returns an empty store for each subtest.
func StoreConformance(t *testing.T, newStore func(t *testing.T) ensure.RecordStore) {
	alice := ensure.Auth{Username: "alice", Password: "a"}
	bob := ensure.Auth{Username: "bob", Password: "b"}
	sa := &ensure.ServiceAccount{Namespace: "ns", Name: "app", UID: "sa-uid"}

	t.Run("an unknown image has no record", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.Get(RefA); !errors.Is(err, ensure.ErrNotFound) {
			t.Errorf("got %v, want ErrNotFound", err)
		}
	})

	t.Run("credentials hash equally when equal and differently when not, and no credential has no hash", func(t *testing.T) {
		s := newStore(t)
		if s.HashAuth(alice) != s.HashAuth(ensure.Auth{Username: "alice", Password: "a"}) {
			t.Errorf("equal credentials hash differently")
		}
		if s.HashAuth(alice) == s.HashAuth(bob) {
			t.Errorf("different credentials hash equally")
		}
		if s.HashAuth(ensure.Auth{Username: "ab", Password: ""}) == s.HashAuth(ensure.Auth{Username: "a", Password: "b"}) {
			t.Errorf("the fields are not delimited")
		}
		if s.HashAuth(ensure.Auth{}) != "" {
			t.Errorf("no credential got a hash")
		}
		if h := s.HashAuth(alice); strings.Contains(h, "alice") || !strings.HasPrefix(h, "sha256:") {
			t.Errorf("hash %q", h)
		}
	})

	t.Run("a pull is recorded per repository, credentials merged without duplicates", func(t *testing.T) {
		s := newStore(t)
		ha, hb := s.HashAuth(alice), s.HashAuth(bob)
		for _, c := range []ensure.Credential{{Hash: ha}, {Hash: hb}, {Hash: ha}, {ServiceAccount: sa}, {ServiceAccount: sa}} {
			if err := s.RecordPull(RefA, "registry.test/team/app", c, "", t0, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RecordPull(RefA, "registry.test/other", ensure.Credential{Node: true}, "", t0.Add(time.Minute), nil); err != nil {
			t.Fatal(err)
		}
		r, err := s.Get(RefA)
		if err != nil {
			t.Fatal(err)
		}
		app := r.CredentialMapping["registry.test/team/app"]
		if len(app.KubernetesSecrets) != 2 || app.KubernetesSecrets[0].CredentialHash != ha || app.KubernetesSecrets[1].CredentialHash != hb {
			t.Errorf("secrets %+v", app.KubernetesSecrets)
		}
		if len(app.KubernetesServiceAccounts) != 1 || app.KubernetesServiceAccounts[0] != *sa || app.NodePodsAccessible {
			t.Errorf("service accounts %+v, node %v", app.KubernetesServiceAccounts, app.NodePodsAccessible)
		}
		if other := r.CredentialMapping["registry.test/other"]; !other.NodePodsAccessible {
			t.Errorf("the node pull was not recorded: %+v", other)
		}
		if r.ImageRef != RefA || !r.LastUpdatedTime.Time.Equal(t0.Add(time.Minute)) {
			t.Errorf("ref %q, updated %v", r.ImageRef, r.LastUpdatedTime)
		}
	})

	t.Run("a pull with no known credential still records the repository, with nothing verified", func(t *testing.T) {
		s := newStore(t)
		if err := s.RecordPull(RefA, "registry.test/app", ensure.Credential{}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		r, _ := s.Get(RefA)
		c, ok := r.CredentialMapping["registry.test/app"]
		if !ok || c.NodePodsAccessible || len(c.KubernetesSecrets)+len(c.KubernetesServiceAccounts) != 0 {
			t.Errorf("mapping %+v, %v", c, ok)
		}
	})

	t.Run("a record holds at most 100 credentials per repository", func(t *testing.T) {
		s := newStore(t)
		for i := 0; i < 105; i++ {
			h := s.HashAuth(ensure.Auth{Username: fmt.Sprint("user", i), Password: "p"})
			if err := s.RecordPull(RefA, "r.test/app", ensure.Credential{Hash: h}, "", t0, nil); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := s.Get(RefA)
		if n := len(r.CredentialMapping["r.test/app"].KubernetesSecrets); n != 100 {
			t.Errorf("%d credentials kept, want 100", n)
		}
	})

	t.Run("an image ID that is not a digest is refused", func(t *testing.T) {
		s := newStore(t)
		if err := s.RecordPull("registry.test/app:v1", "registry.test/app", ensure.Credential{Node: true}, "", t0, nil); !errors.Is(err, records.ErrInvalidImageRef) {
			t.Errorf("got %v, want ErrInvalidImageRef", err)
		}
	})

	t.Run("intents are listed until dropped or settled by the record", func(t *testing.T) {
		s := newStore(t)
		i1, err := s.AddIntent("registry.test/app:v1")
		if err != nil {
			t.Fatal(err)
		}
		i2, _ := s.AddIntent("registry.test/app:v1") // two pulls at once
		i3, _ := s.AddIntent("registry.test/other:v2")
		if in, _ := s.Intents(); len(in) != 3 {
			t.Fatalf("intents %+v", in)
		}
		if err := s.DropIntent(i3); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordPull(RefA, "registry.test/app", ensure.Credential{Node: true}, i1, t0, nil); err != nil {
			t.Fatal(err)
		}
		in, _ := s.Intents()
		if len(in) != 1 || in[0].ID != i2 || in[0].Image != "registry.test/app:v1" {
			t.Errorf("intents %+v, want only %s", in, i2)
		}
		if r, i, _ := s.Counts(); r != 1 || i != 1 {
			t.Errorf("counts %d records, %d intents", r, i)
		}
	})

	t.Run("a repository is restricted while a record holds a mapping for it that is not node-wide", func(t *testing.T) {
		s := newStore(t)
		if s.Restricted("r.test/app") {
			t.Fatalf("an empty store restricts")
		}
		s.RecordPull(RefA, "r.test/public", ensure.Credential{Node: true}, "", t0, nil)
		s.RecordPull(RefA, "r.test/app", ensure.Credential{Hash: s.HashAuth(alice)}, "", t0, nil)
		s.RecordPull(RefB, "r.test/app", ensure.Credential{}, "", t0, nil)
		if s.Restricted("r.test/public") || !s.Restricted("r.test/app") {
			t.Errorf("public %v, app %v", s.Restricted("r.test/public"), s.Restricted("r.test/app"))
		}
		s.Forget(RefA)
		if !s.Restricted("r.test/app") {
			t.Errorf("RefB still restricts r.test/app")
		}
		s.Prune(func(string) bool { return false }, t0.Add(time.Hour))
		if s.Restricted("r.test/app") {
			t.Errorf("no record left, still restricted")
		}
	})

	t.Run("each credential's verification time is kept per image and repository, refreshed, and gone with the record", func(t *testing.T) {
		s := newStore(t)
		secret := ensure.Credential{Hash: s.HashAuth(alice), Secret: &records.SecretRef{Namespace: "ns", Name: "regcred", UID: "s-uid"}}
		s.RecordPull(RefA, "r.test/app", secret, "", t0, nil)
		s.RecordPull(RefA, "r.test/app", ensure.Credential{ServiceAccount: sa}, "", t0.Add(time.Minute), nil)
		s.RecordPull(RefA, "r.test/app", secret, "", t0.Add(time.Hour), nil)
		for key, want := range map[string]time.Time{
			"h:" + s.HashAuth(alice): t0.Add(time.Hour),
			"s:s-uid":                t0.Add(time.Hour),
			"sa:" + sa.UID + "/" + sa.Namespace + "/" + sa.Name: t0.Add(time.Minute),
		} {
			if got, ok, err := s.VerifiedAt(RefA, "r.test/app", key); err != nil || !ok || !got.Equal(want) {
				t.Errorf("VerifiedAt(%s) = %v, %v, %v; want %v", key, got, ok, err, want)
			}
		}
		if _, ok, _ := s.VerifiedAt(RefA, "r.test/other", "h:"+s.HashAuth(alice)); ok {
			t.Errorf("a time for a repository the credential was not verified for")
		}
		if _, ok, _ := s.VerifiedAt(RefB, "r.test/app", "h:"+s.HashAuth(alice)); ok {
			t.Errorf("a time for an image the credential was not verified for")
		}
		s.Forget(RefA)
		if _, ok, _ := s.VerifiedAt(RefA, "r.test/app", "s:s-uid"); ok {
			t.Errorf("a time outlived its record")
		}
	})

	t.Run("the names before an image's first record stay its preloaded names, a later pull's are ignored, and they go with the record", func(t *testing.T) {
		s := newStore(t)
		before := []string{"r.test/team/base:node", "r.test/other/base:1", "not a name!"}
		if err := s.RecordPull(RefA, "r.test/team/base", ensure.Credential{Hash: s.HashAuth(alice)}, "", t0, before); err != nil {
			t.Fatal(err)
		}
		s.RecordPull(RefA, "r.test/team/base", ensure.Credential{Hash: s.HashAuth(bob)}, "", t0, []string{"r.test/team/base:v1"})
		s.RecordPull(RefB, "r.test/team/base", ensure.Credential{Hash: s.HashAuth(bob)}, "", t0, nil)
		want := []string{"r.test/other/base:1", "r.test/team/base:node"}
		if got := s.Preloaded(RefA); !slices.Equal(got, want) {
			t.Errorf("Preloaded(RefA) = %q, want %q", got, want)
		}
		if got := s.Preloaded(RefB); got != nil {
			t.Errorf("an image first recorded with none has %q", got)
		}
		s.Forget(RefA)
		if got := s.Preloaded(RefA); got != nil {
			t.Errorf("%q outlived forget", got)
		}
		s.RecordPull(RefA, "r.test/team/base", ensure.Credential{}, "", t0, before)
		s.Prune(func(string) bool { return false }, t0.Add(time.Hour))
		if got := s.Preloaded(RefA); got != nil {
			t.Errorf("%q outlived prune", got)
		}
	})

	t.Run("forget deletes a record and says whether there was one", func(t *testing.T) {
		s := newStore(t)
		s.RecordPull(RefA, "r.test/a", ensure.Credential{Node: true}, "", t0, nil)
		if ok, err := s.Forget(RefA); !ok || err != nil {
			t.Errorf("Forget = %v, %v", ok, err)
		}
		if ok, _ := s.Forget(RefA); ok {
			t.Errorf("forgot a record twice")
		}
		if _, err := s.Get(RefA); !errors.Is(err, ensure.ErrNotFound) {
			t.Errorf("still there: %v", err)
		}
	})

	t.Run("prune deletes old records of absent images only", func(t *testing.T) {
		s := newStore(t)
		s.RecordPull(RefA, "r.test/a", ensure.Credential{Node: true}, "", t0, nil)
		s.RecordPull(RefB, "r.test/b", ensure.Credential{Node: true}, "", t0.Add(time.Hour), nil)
		n, err := s.Prune(func(string) bool { return false }, t0.Add(time.Minute))
		if err != nil || n != 1 {
			t.Fatalf("pruned %d, %v; want 1", n, err)
		}
		if _, err := s.Get(RefB); err != nil {
			t.Errorf("a recent record was pruned: %v", err)
		}
		if n, _ := s.Prune(func(ref string) bool { return ref == RefB }, t0.Add(2*time.Hour)); n != 0 {
			t.Errorf("a present image's record was pruned")
		}
	})
}
