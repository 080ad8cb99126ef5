package credplugins

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const testBin = "testdata/bin"

func TestLoadConfigVersions(t *testing.T) {
	t.Parallel()
	boolTrue := true
	for _, tc := range []struct {
		name string
		file string
		want []Provider
	}{
		{"a v1 file decodes every field", "v1.yaml", []Provider{{
			Name: "fake-plugin", MatchImages: []string{"*.registry.test", "127.0.0.1:5000"}, DefaultCacheDuration: 5 * time.Minute,
			APIVersion: "credentialprovider.kubelet.k8s.io/v1", Args: []string{"--verbose"}, Env: []EnvVar{{Name: "PLUGIN_MODE", Value: "test"}},
		}}},
		{"a v1beta1 file decodes, a zero default duration included", "v1beta1.yaml", []Provider{{
			Name: "fake-plugin", MatchImages: []string{"registry.test"}, APIVersion: "credentialprovider.kubelet.k8s.io/v1beta1",
		}}},
		{"a v1alpha1 file decodes", "v1alpha1.yaml", []Provider{{
			Name: "fake-plugin", MatchImages: []string{"gcr.io", "*.gcr.io"}, DefaultCacheDuration: time.Hour,
			APIVersion: "credentialprovider.kubelet.k8s.io/v1alpha1",
		}}},
		{"a v1 file with tokenAttributes decodes them", "token.yaml", []Provider{{
			Name: "fake-plugin", MatchImages: []string{"*.registry.test"}, DefaultCacheDuration: time.Minute,
			APIVersion: "credentialprovider.kubelet.k8s.io/v1",
			TokenAttributes: &TokenAttributes{ServiceAccountTokenAudience: "registry.test", CacheType: "ServiceAccount", RequireServiceAccount: &boolTrue,
				RequiredServiceAccountAnnotationKeys: []string{"registry.test/role"}, OptionalServiceAccountAnnotationKeys: []string{"registry.test/tenant"}},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "config", tc.file)
			cfg, err := LoadConfig(path, testBin)
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				tc.want[i].File = path
			}
			if diff := cmp.Diff(tc.want, cfg.Providers, cmpopts.IgnoreUnexported(Provider{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if !strings.HasPrefix(cfg.Hash, "sha256:") {
				t.Errorf("hash %q", cfg.Hash)
			}
		})
	}
}

func TestLoadConfigDirectory(t *testing.T) {
	t.Parallel()
	t.Run("a directory's yaml and json files are merged in lexicographic order, others ignored", func(t *testing.T) {
		cfg, err := LoadConfig("testdata/config/dir", testBin)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range cfg.Providers {
			names = append(names, p.Name)
		}
		if diff := cmp.Diff([]string{"fake-plugin", "other-plugin"}, names); diff != "" {
			t.Errorf("providers (-want +got):\n%s", diff)
		}
	})
	t.Run("a provider name used in two files is an error naming both", func(t *testing.T) {
		dir := t.TempDir()
		for _, f := range []string{"a.yaml", "b.yaml"} {
			copyFile(t, "testdata/config/v1beta1.yaml", filepath.Join(dir, f))
		}
		_, err := LoadConfig(dir, testBin)
		if err == nil || !strings.Contains(err.Error(), "Duplicate value") || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "b.yaml") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("an empty directory is an error", func(t *testing.T) {
		if _, err := LoadConfig(t.TempDir(), testBin); err == nil || !strings.Contains(err.Error(), "no *.json") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("the hash changes with the content", func(t *testing.T) {
		a, _ := LoadConfig("testdata/config/v1.yaml", testBin)
		b, _ := LoadConfig("testdata/config/v1beta1.yaml", testBin)
		if a.Hash == b.Hash {
			t.Errorf("two configurations share a hash")
		}
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	t.Parallel()
	const head = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n"
	provider := func(fields string) string {
		return head + "providers:\n  - " + strings.ReplaceAll(strings.TrimSpace(fields), "\n", "\n    ") + "\n"
	}
	const ok = "name: fake-plugin\nmatchImages: [registry.test]\ndefaultCacheDuration: 1m\napiVersion: credentialprovider.kubelet.k8s.io/v1"
	for _, tc := range []struct {
		name string
		yaml string
		want []string // each appears in the error
	}{
		{"a valid provider loads", provider(ok), nil},
		{"no providers is an error", head + "providers: []\n", []string{"at least 1 provider"}},
		{"a name with a slash is refused", provider(strings.Replace(ok, "fake-plugin", "../fake-plugin", 1)), []string{`provider "../fake-plugin"`, "providers[0].name", "cannot contain '/'"}},
		{"a name with a space is refused", provider(strings.Replace(ok, "fake-plugin", "fake plugin", 1)), []string{"cannot contain spaces"}},
		{"the name '..' is refused", provider(strings.Replace(ok, "fake-plugin", `".."`, 1)), []string{"cannot be '.' or '..'"}},
		{"a name not in the bin directory is refused", provider(strings.Replace(ok, "fake-plugin", "missing-plugin", 1)), []string{"providers[0].name", "no executable", "missing-plugin"}},
		{"a missing apiVersion is refused", provider(strings.Replace(ok, "apiVersion: credentialprovider.kubelet.k8s.io/v1", "", 1)), []string{"providers[0].apiVersion: Required value"}},
		{"an unknown apiVersion is refused with the supported ones", provider(strings.Replace(ok, "kubelet.k8s.io/v1", "kubelet.k8s.io/v2", 1)), []string{"providers[0].apiVersion: Unsupported value", "credentialprovider.kubelet.k8s.io/v1beta1"}},
		{"empty matchImages are refused", provider(strings.Replace(ok, "[registry.test]", "[]", 1)), []string{"providers[0].matchImages: Required value"}},
		{"an unparsable matchImage is refused with its index", provider(strings.Replace(ok, "[registry.test]", `[registry.test, "%zz"]`, 1)), []string{"providers[0].matchImages[1]: Invalid value", "match image is invalid"}},
		{"a malformed glob is refused", provider(strings.Replace(ok, "[registry.test]", `["reg\\\\.test"]`, 1)), []string{"providers[0].matchImages[0]"}},
		{"a missing defaultCacheDuration is refused", provider(strings.Replace(ok, "defaultCacheDuration: 1m", "", 1)), []string{"providers[0].defaultCacheDuration: Required value"}},
		{"a negative defaultCacheDuration is refused", provider(strings.Replace(ok, "1m", "-1m", 1)), []string{"providers[0].defaultCacheDuration: Invalid value", "greater than or equal to 0"}},
		{"an unknown field is refused by name", provider(ok + "\nmatchImage: [x]"), []string{`unknown field "providers[0].matchImage"`}},
		{"another kind is refused", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n", []string{"KubeletConfiguration"}},
		{"tokenAttributes in a v1beta1 file is an unknown field", strings.Replace(provider(ok), "kubelet.config.k8s.io/v1\n", "kubelet.config.k8s.io/v1beta1\n", 1) + "    tokenAttributes: {serviceAccountTokenAudience: a}\n", []string{"tokenAttributes"}},
		{"tokenAttributes need a v1 plugin API", provider(strings.Replace(ok, "kubelet.k8s.io/v1", "kubelet.k8s.io/v1beta1", 1) + "\ntokenAttributes: {serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true}"),
			[]string{"providers[0].tokenAttributes: Forbidden", "only supported for credentialprovider.kubelet.k8s.io/v1"}},
		{"tokenAttributes need an audience, a cacheType and requireServiceAccount", provider(ok + "\ntokenAttributes: {}"),
			[]string{"serviceAccountTokenAudience: Required value", "cacheType: Required value", "requireServiceAccount: Required value"}},
		{"an unknown cacheType is refused", provider(ok + "\ntokenAttributes: {serviceAccountTokenAudience: a, cacheType: Pod, requireServiceAccount: true}"), []string{"cacheType: Unsupported value"}},
		{"required annotation keys need requireServiceAccount", provider(ok + "\ntokenAttributes: {serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: false, requiredServiceAccountAnnotationKeys: [x]}"),
			[]string{"requireServiceAccount cannot be false"}},
		{"an annotation key both required and optional is refused", provider(ok + "\ntokenAttributes: {serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [x], optionalServiceAccountAnnotationKeys: [x]}"),
			[]string{"cannot be both required and optional"}},
		{"a duplicate or invalid annotation key is refused", provider(ok + "\ntokenAttributes: {serviceAccountTokenAudience: a, cacheType: Token, requireServiceAccount: true, optionalServiceAccountAnnotationKeys: [x, x, '-bad-']}"),
			[]string{"optionalServiceAccountAnnotationKeys[1]: Duplicate value", "optionalServiceAccountAnnotationKeys[2]: Invalid value"}},
		{"every problem is reported at once", provider(strings.Replace(strings.Replace(ok, "1m", "-1m", 1), "[registry.test]", "[]", 1)), []string{"defaultCacheDuration", "matchImages"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "providers.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(path, testBin)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded; want an error with %q", tc.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error does not name the file: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// FuzzDecodeConfig: arbitrary bytes never panic the config decoder and
// validation.
func FuzzDecodeConfig(f *testing.F) {
	for _, name := range []string{"v1.yaml", "v1beta1.yaml", "v1alpha1.yaml", "token.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata", "config", name))
		if err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		providers, err := decodeConfig(data)
		if err != nil {
			return
		}
		for i := range providers {
			validateProvider(nil, &providers[i], testBin)
		}
	})
}
