package kubeletrecords

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

const (
	idA = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	idB = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// kubeletDir lays out testdata files as the kubelet would, under their
// keys' file names.
func kubeletDir(t *testing.T, records map[string]string, intents map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for sub, files := range map[string]map[string]string{PulledDir: records, PullingDir: intents} {
		os.MkdirAll(filepath.Join(dir, sub), 0o700)
		for key, fixture := range files {
			data, err := os.ReadFile(filepath.Join("testdata", fixture))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, sub, FileName(key)), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func TestRead(t *testing.T) {
	t.Run("the kubelet's records are read, v1alpha1 too, with every secret left out and counted", func(t *testing.T) {
		dir := kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json", idB: "kubelet-v1alpha1-record.json"},
			map[string]string{"registry.example/team-a/app:v2": "kubelet-intent.json"})
		recs, intents, rep, err := Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Records != 2 || rep.Intents != 1 || rep.SecretsNotCarried != 2 || len(recs) != 2 {
			t.Fatalf("report %+v, %d records", rep, len(recs))
		}
		byID := map[string]*Record{}
		for _, r := range recs {
			byID[r.ImageRef] = r
			for repo, c := range r.CredentialMapping {
				if len(c.KubernetesSecrets) != 0 {
					t.Errorf("%s %s: secrets carried: %v", r.ImageRef, repo, c.KubernetesSecrets)
				}
			}
		}
		a := byID[idA].CredentialMapping
		if sa := a["registry.example/team-a/app"].KubernetesServiceAccounts; len(sa) != 1 || sa[0].Name != "builder" {
			t.Errorf("service accounts of A: %v", sa)
		}
		if !a["registry.example/base"].NodePodsAccessible {
			t.Errorf("nodePodsAccessible lost: %v", a)
		}
		if _, ok := byID[idB].CredentialMapping["registry.example/team-b/app"]; !ok {
			t.Errorf("B's record lost its repository (it must still say: pulled with credentials): %v", byID[idB])
		}
		if len(intents) != 1 || intents[0] != "registry.example/team-a/app:v2" {
			t.Errorf("intents %v", intents)
		}
	})

	t.Run("temporary and foreign files are skipped, as the kubelet skips them", func(t *testing.T) {
		dir := kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json"}, nil)
		os.WriteFile(filepath.Join(dir, PulledDir, FileName(idB)+".tmp"), []byte("half"), 0o600)
		os.WriteFile(filepath.Join(dir, PulledDir, "README"), []byte("x"), 0o600)
		recs, _, rep, err := Read(dir)
		if err != nil || len(recs) != 1 || rep.Skipped != 2 {
			t.Fatalf("%d records, %+v, %v", len(recs), rep, err)
		}
	})

	for _, tc := range []struct {
		name, file, data, want string
	}{
		{"a record under another image's file name is refused, naming the file", FileName(idB), "", "holds image"},
		{"an unknown field is refused", FileName(idA), strings.Replace(readFixture(t, "kubelet-v1beta1-record.json"), `"imageRef"`, `"extra":1,"imageRef"`, 1), "unknown field"},
		{"another kind is refused", FileName(idA), `{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1beta1","image":"x"}`, "want ImagePulledRecord"},
		{"another group is refused", FileName(idA), strings.Replace(readFixture(t, "kubelet-v1beta1-record.json"), "kubelet.config.k8s.io", "imagemanager.kubelet.config.k8s.io", 1), "want ImagePulledRecord"},
		{"a file that is not JSON is refused", FileName(idA), "{not json", "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, PulledDir), 0o700)
			data := tc.data
			if data == "" {
				data = readFixture(t, "kubelet-v1beta1-record.json")
			}
			path := filepath.Join(dir, PulledDir, tc.file)
			os.WriteFile(path, []byte(data), 0o600)
			recs, _, _, err := Read(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) || recs != nil {
				t.Fatalf("got %v (%d records), want an error naming %s and saying %q", err, len(recs), path, tc.want)
			}
		})
	}
}

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWrite(t *testing.T) {
	rec := &Record{ImageRef: idA, LastUpdatedTime: metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)),
		CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{
			"registry.example/team-a/app": {
				KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{
					{UID: "5e0f", Namespace: "team-a", Name: "regcred", CredentialHash: "salted-hash-of-the-proxy"},
					{CredentialHash: "hash-only"},
				},
				KubernetesServiceAccounts: []kubeletconfigv1beta1.ImagePullServiceAccount{{UID: "a1", Namespace: "team-a", Name: "builder"}},
			},
			"registry.example/base": {NodePodsAccessible: true},
		}}
	dir := t.TempDir()
	rep, err := Write(dir, []*Record{rec}, nil, []string{"registry.example/team-a/app:v2"})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("secrets cross by their coordinates with no hash; hash-only ones stay behind, counted", func(t *testing.T) {
		if rep.Records != 1 || rep.Intents != 1 || rep.SecretsByCoordinates != 1 || rep.HashOnlySecrets != 1 {
			t.Fatalf("report %+v", rep)
		}
		data, err := os.ReadFile(filepath.Join(dir, PulledDir, FileName(idA)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRecord(data)
		if err != nil {
			t.Fatal(err)
		}
		s := got.CredentialMapping["registry.example/team-a/app"].KubernetesSecrets
		if len(s) != 1 || s[0].Name != "regcred" || s[0].UID != "5e0f" || s[0].CredentialHash != "" {
			t.Errorf("secrets written: %+v", s)
		}
		if strings.Contains(string(data), "salted-hash") || strings.Contains(string(data), "hash-only") {
			t.Errorf("a proxy hash reached the kubelet's file: %s", data)
		}
		if !got.LastUpdatedTime.Equal(&rec.LastUpdatedTime) || !got.CredentialMapping["registry.example/base"].NodePodsAccessible {
			t.Errorf("record written: %+v", got)
		}
		if len(rec.CredentialMapping["registry.example/team-a/app"].KubernetesSecrets) != 2 {
			t.Errorf("Write changed the record it was given")
		}
	})

	t.Run("files and directories have the kubelet's modes and names, and read back", func(t *testing.T) {
		for path, mode := range map[string]os.FileMode{
			filepath.Join(dir, PulledDir):                                              0o700 | os.ModeDir,
			filepath.Join(dir, PullingDir):                                             0o700 | os.ModeDir,
			filepath.Join(dir, PulledDir, FileName(idA)):                               0o600,
			filepath.Join(dir, PullingDir, FileName("registry.example/team-a/app:v2")): 0o600,
		} {
			if fi, err := os.Stat(path); err != nil || fi.Mode() != mode {
				t.Errorf("%s: %v %v, want %v", path, fi.Mode(), err, mode)
			}
		}
		recs, intents, back, err := Read(dir)
		if err != nil || len(recs) != 1 || len(intents) != 1 || back.SecretsNotCarried != 1 {
			t.Fatalf("read back: %d records, %v, %+v, %v", len(recs), intents, back, err)
		}
	})
}

func TestWriteMergesWithTheKubeletsOwn(t *testing.T) {
	dir := kubeletDir(t, map[string]string{idA: "kubelet-v1beta1-record.json"}, nil)
	ours := &Record{ImageRef: idA, LastUpdatedTime: metav1.NewTime(time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)),
		CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{
			"registry.example/team-a/app": {KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{
				{UID: "5e0f", Namespace: "team-a", Name: "regcred", CredentialHash: "ours"}, // the kubelet's own, by coordinates
				{UID: "6a", Namespace: "team-a", Name: "second", CredentialHash: "ours"},
			}},
		}}
	if _, err := Write(dir, []*Record{ours}, nil, nil); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, PulledDir, FileName(idA)))
	got, err := DecodeRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	secrets := got.CredentialMapping["registry.example/team-a/app"].KubernetesSecrets
	if len(secrets) != 2 || secrets[0].CredentialHash != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" || secrets[1].Name != "second" || secrets[1].CredentialHash != "" {
		t.Errorf("secrets after the merge: %+v", secrets)
	}
	if len(got.CredentialMapping["registry.example/team-a/app"].KubernetesServiceAccounts) != 1 || !got.CredentialMapping["registry.example/base"].NodePodsAccessible {
		t.Errorf("the kubelet's own entries were lost: %+v", got.CredentialMapping)
	}
	if !got.LastUpdatedTime.Equal(&ours.LastUpdatedTime) {
		t.Errorf("update time %v, want the later one", got.LastUpdatedTime)
	}

	t.Run("a kubelet file that does not decode is not overwritten", func(t *testing.T) {
		path := filepath.Join(dir, PulledDir, FileName(idA))
		os.WriteFile(path, []byte("{broken"), 0o600)
		if _, err := Write(dir, []*Record{ours}, nil, nil); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("got %v, want an error naming %s", err, path)
		}
		if b, _ := os.ReadFile(path); string(b) != "{broken" {
			t.Errorf("overwritten: %s", b)
		}
	})
}

func FuzzDecodeRecord(f *testing.F) {
	for _, name := range []string{"kubelet-v1beta1-record.json", "kubelet-v1alpha1-record.json", "kubelet-intent.json", "kubelet-preloaded.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := DecodeRecord(data); err == nil {
			if r.ImageRef == "" {
				t.Fatalf("decoded a record with no imageRef")
			}
			var rep WriteReport
			forKubelet(r, &rep) // must not panic on anything that decodes
		}
		if image, err := DecodeIntent(data); err == nil && image == "" {
			t.Fatalf("decoded an intent with no image")
		}
		if p, err := DecodePreloaded(data); err == nil {
			if p.ImageRef == "" {
				t.Fatalf("decoded a preloaded record with no imageRef")
			}
			forKubeletPreloaded(p, nil) // must not panic on anything that decodes
			fromKubeletPreloaded(p, nil, nil, &records.Image{ID: p.ImageRef, Names: []string{"registry.example/preloaded/app:node"}})
		}
	})
}
