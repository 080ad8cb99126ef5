package kubeletrecords

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	digest "github.com/opencontainers/go-digest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

func TestImport(t *testing.T) {
	store, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// The proxy already knows A, pulled by a secret of its own.
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	if err := store.RecordPull(idA, "registry.example/team-a/app", records.Credential{Hash: store.HashAuth(records.Auth{Username: "u", Password: "p"})}, "", now, nil); err != nil {
		t.Fatal(err)
	}
	recs, intents, rep, err := Read(kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json", idB: "kubelet-v1alpha1-record.json"},
		map[string]string{"registry.example/team-a/app:v2": "kubelet-intent.json"}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Import(store, recs, nil, intents, notAsked(t))
	if err != nil {
		t.Fatal(err)
	}
	merged := res.Merged

	t.Run("the proxy's own credentials stay, the kubelet's accounts and flags join them, its secrets do not", func(t *testing.T) {
		if merged != 1 || rep.SecretsNotCarried != 2 {
			t.Fatalf("merged %d, report %+v", merged, rep)
		}
		a, err := store.Get(idA)
		if err != nil {
			t.Fatal(err)
		}
		c := a.CredentialMapping["registry.example/team-a/app"]
		if len(c.KubernetesSecrets) != 1 || c.KubernetesSecrets[0].Name != "" {
			t.Errorf("secrets of A: %+v, want the proxy's own hash only", c.KubernetesSecrets)
		}
		if len(c.KubernetesServiceAccounts) != 1 || !a.CredentialMapping["registry.example/base"].NodePodsAccessible {
			t.Errorf("A after the import: %+v", a.CredentialMapping)
		}
		if !a.LastUpdatedTime.Equal(&metav1.Time{Time: now}) {
			t.Errorf("A's update time %v, want the later one, %v", a.LastUpdatedTime, now)
		}
	})

	t.Run("an image known only to the kubelet is recorded as pulled with credentials, none carried: its pods verify", func(t *testing.T) {
		b, err := store.Get(idB)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := b.CredentialMapping["registry.example/team-b/app"]
		if !ok || len(c.KubernetesSecrets) != 0 || len(c.KubernetesServiceAccounts) != 0 || c.NodePodsAccessible {
			t.Errorf("B: %+v", b.CredentialMapping)
		}
	})

	t.Run("the kubelet's pulls in flight become the proxy's intents", func(t *testing.T) {
		in, err := store.Intents()
		if err != nil || len(in) != 1 || in[0].Image != "registry.example/team-a/app:v2" {
			t.Fatalf("intents %+v, %v", in, err)
		}
	})

	t.Run("a record that cannot be read stops the import before anything is written", func(t *testing.T) {
		bad := &Record{ImageRef: "not-a-digest"}
		bad.CredentialMapping = map[string]kubeletconfigv1beta1.ImagePullCredentials{"x": {}}
		if _, err := Import(store, []*Record{bad}, nil, []string{"never"}, notAsked(t)); err == nil {
			t.Fatal("imported a record with an invalid image ID")
		}
		if in, _ := store.Intents(); len(in) != 1 {
			t.Errorf("intents after a failed import: %+v", in)
		}
	})
}

// node is the runtime's images for the tests: image ID -> names.
type node map[string][]string

func (n node) images() ([]records.Image, error) {
	var out []records.Image
	for id, names := range n {
		out = append(out, records.NodeImage(id, names))
	}
	return out, nil
}

// Image, Images, ImageLayers, PodUID and PodUIDs make node an ensure.Runtime.
func (n node) Image(_ context.Context, q crireq.ImageQuery) (crireq.Image, bool, error) {
	for id, names := range n {
		if id == q.Name || slices.Contains(names, q.Name) {
			return crireq.Image{ID: id, Names: names}, true, nil
		}
	}
	return crireq.Image{}, false, nil
}

func (n node) Images(context.Context) ([]crireq.Image, error) {
	var out []crireq.Image
	for id, names := range n {
		out = append(out, crireq.Image{ID: id, Names: names})
	}
	return out, nil
}

func (node) PodUID(context.Context, string) (string, error) { return "", nil }
func (node) RuntimeID(id string) string                     { return id }

func (node) ImageLayers(context.Context, string) ([]digest.Digest, bool, error) {
	return nil, false, nil
}
func (node) PodUIDs(context.Context) (map[string]bool, error) { return nil, nil }
func noRuntime() ([]records.Image, error)                     { return nil, errors.New("connection refused") }
func notAsked(t *testing.T) func() ([]records.Image, error) {
	return func() ([]records.Image, error) { t.Error("the runtime was asked"); return nil, nil }
}

// TestImportOfARecordThatNamesNoRepository: the kubelet settles a crash's
// pull intents into records with no credentialMapping, or an empty one:
// "pulled, every pod must verify". The proxy decides per repository, so
// such a record must name every repository the runtime lists its image
// under, each with no credential; otherwise, under
// NeverVerifyPreloadedImages, the image passes for a preloaded one.
func TestImportOfARecordThatNamesNoRepository(t *testing.T) {
	const (
		idC = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
		idD = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	)
	dir := kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json", idC: "kubelet-record-settled-intent.json", idD: "kubelet-record-empty-mapping.json"},
		map[string]string{"registry.example/team-a/app:v2": "kubelet-intent.json"})
	// C is listed under two repositories; D is not on the node.
	onNode := node{idC: {"registry.example/team-c/app:v1", "mirror.example/team-c/app@" + idC, idC}}
	open := func(t *testing.T) *records.Store {
		s, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}

	t.Run("each repository the image is listed under is recorded with no credential, and a pod without one must verify", func(t *testing.T) {
		store := open(t)
		recs, intents, _, err := Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Import(store, recs, nil, intents, onNode.images)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Unmapped != 2 || rep.Repositories != 2 || rep.NoRepository != 1 {
			t.Errorf("report %+v, want 2 records without a repository, 2 repositories given to them, 1 left without (its image is not on the node)", rep)
		}
		c, err := store.Get(idC)
		if err != nil {
			t.Fatal(err)
		}
		for _, repo := range []string{"registry.example/team-c/app", "mirror.example/team-c/app"} {
			m, ok := c.CredentialMapping[repo]
			if !ok || m.NodePodsAccessible || len(m.KubernetesSecrets)+len(m.KubernetesServiceAccounts) != 0 {
				t.Errorf("C as %s: %+v (present %v), want pulled with no credential", repo, m, ok)
			}
			if !store.Restricted(repo) {
				t.Errorf("%s is not restricted: ImageStatus would show it without reading the record", repo)
			}
		}
		policy, err := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
		if err != nil {
			t.Fatal(err)
		}
		decider, err := ensure.NewDecider(store, policy, onNode, ensure.DeciderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"registry.example/team-c/app:v1", "mirror.example/team-c/app@" + idC, idC} {
			e, err := decider.Explain(context.Background(), name, "")
			if err != nil {
				t.Fatal(err)
			}
			if !e.NeedsVerification {
				t.Errorf("%s under %s: %s; want verification (the kubelet's record said pulled)", name, policy.Name(), e.Verdict)
			}
		}
		if d, err := store.Get(idD); err != nil || len(d.CredentialMapping) != 0 {
			t.Errorf("D, not on the node: %+v, %v; want its record, naming no repository", d, err)
		}
	})

	t.Run("when the runtime cannot be asked, nothing is imported", func(t *testing.T) {
		store := open(t)
		recs, intents, _, err := Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Import(store, recs, nil, intents, noRuntime)
		if !errors.Is(err, ErrRepositoriesUnknown) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("got %v, want ErrRepositoriesUnknown with the runtime's error", err)
		}
		if n, i, _ := store.Counts(); n != 0 || i != 0 {
			t.Errorf("%d records and %d intents imported", n, i)
		}
	})

	t.Run("records that name their repositories need no runtime", func(t *testing.T) {
		store := open(t)
		recs, intents, _, err := Read(kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Import(store, recs, nil, intents, notAsked(t)); err != nil {
			t.Fatal(err)
		}
	})
}
