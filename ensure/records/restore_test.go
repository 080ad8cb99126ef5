package records

import (
	"bytes"
	"errors"
	digest "github.com/opencontainers/go-digest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRestore installs an older backup over a database that has since
// recorded more pulls: the images the backup does not know, as a whole or
// as some repository, must need verification, not pass for preloaded.
func TestRestore(t *testing.T) {
	t.Parallel()
	const (
		repoA, repoB, repoMirror = "r.test/team-a/app", "r.test/team-b/app", "mirror.test/team-a/app"
		refB                     = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		refNameless              = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	)
	alice := Auth{Username: "alice", Password: "a"}
	later := t0.Add(time.Hour)
	// setup makes the backup (A pulled by alice as repoA) and the database
	// after it (B pulled since, A also as a mirror).
	setup := func(t *testing.T) (path, backup string) {
		dir := t.TempDir()
		path, backup = filepath.Join(dir, "ensure.db"), filepath.Join(t.TempDir(), "backup.db")
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RecordPull(refA, repoA, Credential{Hash: s.HashAuth(alice)}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
		data, _ := os.ReadFile(path)
		if err := os.WriteFile(backup, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, _ = Open(path, Options{})
		for _, p := range []struct{ ref, repo string }{{refB, repoB}, {refA, repoMirror}} {
			if err := s.RecordPull(p.ref, p.repo, Credential{Hash: s.HashAuth(alice)}, "", later, nil); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		return path, backup
	}
	present := []Image{{ID: refA, Repositories: []string{repoA, repoMirror}}, {ID: refB, Repositories: []string{repoB}}, {ID: refNameless}}

	t.Run("what the backup does not know is pulled with no verified credential; what it knows stays", func(t *testing.T) {
		path, backup := setup(t)
		before, _ := os.ReadFile(path)
		rep, err := Restore(path, backup, present, later, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Images != 3 || rep.Repositories != 2 || rep.Kept == "" {
			t.Errorf("report %+v, want 3 images and 2 repositories marked, the old file kept", rep)
		}
		s, err := Open(path, Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		a, err := s.Get(refA)
		if err != nil {
			t.Fatal(err)
		}
		if c := a.CredentialMapping[repoA]; len(c.KubernetesSecrets) != 1 || c.KubernetesSecrets[0].CredentialHash != s.HashAuth(alice) {
			t.Errorf("A as %s: %+v, want the backup's verified credential (and the backup's salt)", repoA, c)
		}
		for _, p := range []struct{ ref, repo string }{{refA, repoMirror}, {refB, repoB}} {
			r, err := s.Get(p.ref)
			if err != nil {
				t.Fatal(err)
			}
			c, ok := r.CredentialMapping[p.repo]
			if !ok || c.NodePodsAccessible || len(c.KubernetesSecrets)+len(c.KubernetesServiceAccounts) != 0 {
				t.Errorf("%s as %s: %+v (present %v), want pulled with no verified credential", p.ref, p.repo, c, ok)
			}
			if !s.Restricted(p.repo) {
				t.Errorf("%s is not restricted", p.repo)
			}
		}
		if r, err := s.Get(refNameless); err != nil || len(r.CredentialMapping) != 0 {
			t.Errorf("the image with no name: %+v, %v; want a record naming no repository (a lookup by ID verifies)", r, err)
		}
		if kept, _ := os.ReadFile(rep.Kept); !bytes.Equal(kept, before) {
			t.Errorf("%s is not the file the restore replaced", rep.Kept)
		}
		if left, _ := filepath.Glob(path + ".restore-*"); len(left) != 0 {
			t.Errorf("left beside the database: %v", left)
		}
	})

	t.Run("the pull intents of the database it replaces are carried, so an image still arriving is settled at the next start", func(t *testing.T) {
		path, backup := setup(t)
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddIntent("r.test/team-a/slow:v1"); err != nil {
			t.Fatal(err)
		}
		s.Close()
		rep, err := Restore(path, backup, present, later, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Intents != 1 || rep.IntentsLost != "" {
			t.Errorf("report %+v, want 1 intent carried", rep)
		}
		s, err = Open(path, Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		in, err := s.Intents()
		if err != nil || len(in) != 1 || in[0].Image != "r.test/team-a/slow:v1" {
			t.Errorf("intents after the restore: %+v, %v; want the one in flight", in, err)
		}
		if _, n, _ := s.Counts(); n != 1 {
			t.Errorf("intent count %d, want 1", n)
		}
	})

	t.Run("a database whose intents cannot be read is refused, and replaced only when the operator forgets them", func(t *testing.T) {
		path, backup := setup(t)
		if err := os.WriteFile(path, []byte("not a database"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Restore(path, backup, present, later, RestoreOptions{}); !errors.Is(err, ErrIntentsUnreadable) {
			t.Fatalf("got %v, want ErrIntentsUnreadable", err)
		}
		if data, _ := os.ReadFile(path); string(data) != "not a database" {
			t.Fatalf("the refused restore changed the file")
		}
		rep, err := Restore(path, backup, present, later, RestoreOptions{ForgetUnreadableIntents: true})
		if err != nil {
			t.Fatal(err)
		}
		if rep.IntentsLost == "" || rep.Intents != 0 {
			t.Errorf("report %+v, want the intents named lost", rep)
		}
	})

	t.Run("the layers of images named preloaded are kept as on the node before anything", func(t *testing.T) {
		path, backup := setup(t)
		const refPreloaded = "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
		layers := []digest.Digest{digest.FromString("base")}
		if _, err := Restore(path, backup, present, later, RestoreOptions{Preloaded: map[string][]digest.Digest{refPreloaded: layers}}); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, ok := s.Layers(refPreloaded)
		if !ok || !slices.Equal(l.DiffIDs, layers) || !l.Seen.IsZero() {
			t.Errorf("layers %+v, %v; want the named image's, seen at the zero time", l, ok)
		}
	})

	t.Run("a database that is absent is restored, with nothing to keep", func(t *testing.T) {
		_, backup := setup(t)
		path := filepath.Join(t.TempDir(), "state", "ensure.db")
		rep, err := Restore(path, backup, present, later, RestoreOptions{})
		if err != nil || rep.Kept != "" {
			t.Fatalf("report %+v, %v", rep, err)
		}
		if s, err := Open(path, Options{ReadOnly: true}); err != nil {
			t.Error(err)
		} else {
			s.Close()
		}
	})

	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, path, backup string) (cleanup func())
		want    string
	}{
		{"while the database is open elsewhere (the daemon), nothing is restored", func(t *testing.T, path, _ string) func() {
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			return func() { s.Close() }
		}, ErrLocked.Error()},
		{"an empty backup is refused", func(t *testing.T, _, backup string) func() {
			os.WriteFile(backup, nil, 0o600)
			return func() {}
		}, "the backup"},
		{"a truncated backup is refused", func(t *testing.T, _, backup string) func() {
			data, _ := os.ReadFile(backup)
			os.WriteFile(backup, data[:2*4096+10], 0o600)
			return func() {}
		}, "the backup"},
		{"the database as its own backup is refused", func(t *testing.T, path, backup string) func() {
			os.Remove(backup)
			os.Link(path, backup)
			return func() {}
		}, "is the database itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, backup := setup(t)
			defer tc.prepare(t, path, backup)()
			before, _ := os.ReadFile(path)
			_, err := Restore(path, backup, present, later, RestoreOptions{OpenTimeout: 100 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Errorf("the database changed")
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(left) != 1 {
				t.Errorf("files beside the database: %v", left)
			}
		})
	}
}

// TestRestoreCarriesThePreloadedNames: a backup taken before an image's
// first recorded pull does not know what it was listed under before it;
// the database it replaces does, and that is a fact of the node: its
// preloaded names outlive the restore, for images still on the node.
func TestRestoreCarriesThePreloadedNames(t *testing.T) {
	t.Parallel()
	const refGone = "sha256:dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
	dir := t.TempDir()
	path, backup := filepath.Join(dir, "ensure.db"), filepath.Join(t.TempDir(), "backup.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	data, _ := os.ReadFile(path)
	os.WriteFile(backup, data, 0o600)
	s, _ = Open(path, Options{})
	alice := Credential{Hash: s.HashAuth(Auth{Username: "alice", Password: "a"})}
	s.RecordPull(refA, "r.test/team/base", alice, "", t0, []string{"r.test/team/base:node", "r.test/other/base:1"})
	s.RecordPull(refGone, "r.test/team/gone", alice, "", t0, []string{"r.test/team/gone:node"})
	s.Close()

	present := []Image{{ID: refA, Repositories: []string{"r.test/team/base", "r.test/other/base"}}}
	rep, err := Restore(path, backup, present, t0.Add(time.Hour), RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PreloadedCarried != 1 || rep.Images != 1 {
		t.Errorf("report %+v", rep)
	}
	s, err = Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Preloaded(refA); !slices.Equal(got, []string{"r.test/other/base:1", "r.test/team/base:node"}) {
		t.Errorf("preloaded names after the restore: %q", got)
	}
	if r, err := s.Get(refA); err != nil || r.CredentialMapping["r.test/team/base"].KubernetesSecrets != nil {
		t.Errorf("the image the backup does not know: %+v, %v; want pulled with no verified credential", r, err)
	}
	if got := s.Preloaded(refGone); got != nil {
		t.Errorf("an image gone from the node kept %q", got)
	}
}
