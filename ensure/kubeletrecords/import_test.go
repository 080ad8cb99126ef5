package kubeletrecords

import (
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

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
	if err := store.RecordPull(idA, "registry.example/team-a/app", records.Credential{Hash: store.HashAuth(records.Auth{Username: "u", Password: "p"})}, "", now); err != nil {
		t.Fatal(err)
	}
	recs, intents, rep, err := Read(kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json", idB: "kubelet-v1alpha1-record.json"},
		map[string]string{"registry.example/team-a/app:v2": "kubelet-intent.json"}))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := Import(store, recs, intents)
	if err != nil {
		t.Fatal(err)
	}

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
		if _, err := Import(store, []*Record{bad}, []string{"never"}); err == nil {
			t.Fatal("imported a record with an invalid image ID")
		}
		if in, _ := store.Intents(); len(in) != 1 {
			t.Errorf("intents after a failed import: %+v", in)
		}
	})
}
