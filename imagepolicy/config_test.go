package imagepolicy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const testBin = "testdata/bin"

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		path      string
		want      []Provider
		defaultNS string
	}{
		{"a file with every field decodes them", "testdata/config/full.yaml", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1",
			MatchImages: []string{"*.registry.test", "127.0.0.1:5000"}, Namespaces: []string{"secure", "payments"},
			Timeout: 10 * time.Second, FailurePolicy: Ignore, AllowCacheDuration: 2 * time.Hour, DenyCacheDuration: 0,
			SendCredentials: true, Args: []string{"--policy", "/etc/cri-image-proxy/sigstore-policy.yaml"}, Env: []EnvVar{{"MODE", "strict"}},
			File: "testdata/config/full.yaml",
		}}, "node-pulls"},
		{"a minimal file gets the defaults: 30s, Fail, 1h allow, 1m deny, no credentials", "testdata/config/defaults.yaml", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"registry.test"},
			Namespaces: []string{"*"}, Timeout: 30 * time.Second, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			File: "testdata/config/defaults.yaml",
		}}, ""},
		{"a directory's yaml and json files are read in lexicographic order, others ignored", "testdata/config/dir", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"registry.test"},
			Namespaces: []string{"secure"}, Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			File: "testdata/config/dir/10-signatures.yaml",
		}, {
			Name: "other-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"*.example.com"},
			Namespaces: []string{"*"}, Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			File: "testdata/config/dir/20-other.json",
		}}, "bake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := LoadConfig(tc.path, testBin)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, cfg.Providers); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if cfg.DefaultNamespace != tc.defaultNS || cfg.BinDir != testBin || !strings.HasPrefix(cfg.Hash, "sha256:") {
				t.Errorf("defaultNamespace %q, binDir %q, hash %q", cfg.DefaultNamespace, cfg.BinDir, cfg.Hash)
			}
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	t.Parallel()
	const head = "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\n"
	const good = "  - name: sigstore-image-policy\n    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1\n    matchImages: [registry.test]\n    namespaces: [secure]\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string // each in the error
	}{
		{"another kind is refused", map[string]string{"a.yaml": "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\nproviders: []\n"},
			[]string{`apiVersion/kind is "config.cri-image-proxy.io/v1alpha1"/"ProxyConfiguration"`}},
		{"a misspelt field is refused with its path", map[string]string{"a.yaml": head + "providers:\n" + good + "    failurPolicy: Ignore\n"},
			[]string{"a.yaml", `unknown field "providers[0].failurPolicy"`}},
		{"a duplicate field is refused", map[string]string{"a.yaml": head + "providers:\n" + good + "    namespaces: [other]\n"},
			[]string{"a.yaml", "namespaces"}},
		{"a file without providers is refused", map[string]string{"a.yaml": head + "providers: []\n"},
			[]string{"a.yaml", "providers: Required value"}},
		{"every bad field is named at once, with the file and the provider", map[string]string{"a.yaml": head + "providers:\n" +
			"  - name: absent-plugin\n    apiVersion: imagepolicy.cri-image-proxy.io/v2\n    matchImages: ['[bad']\n    namespaces: [Secure, '*']\n" +
			"    timeout: 0s\n    allowCacheDuration: -1s\n    failurePolicy: Open\n    env: [{name: '', value: x}]\n"},
			[]string{`a.yaml: provider "absent-plugin": providers[0].name: Invalid value: "absent-plugin": no executable testdata/bin/absent-plugin`,
				`providers[0].apiVersion: Unsupported value: "imagepolicy.cri-image-proxy.io/v2"`,
				`providers[0].matchImages[0]: Invalid value: "[bad"`,
				`providers[0].namespaces[0]: Invalid value: "Secure"`,
				`providers[0].namespaces[1]: Invalid value: "*": "*" covers every namespace: list it alone`,
				`providers[0].timeout: Invalid value: "0s": must be positive`,
				`providers[0].allowCacheDuration: Invalid value: "-1s": must not be negative`,
				`providers[0].failurePolicy: Unsupported value: "Open"`,
				`providers[0].env[0].name: Required value`}},
		{"missing required fields are named", map[string]string{"a.yaml": head + "providers:\n  - name: sigstore-image-policy\n"},
			[]string{"providers[0].apiVersion: Required value", "providers[0].matchImages: Required value", "providers[0].namespaces: Required value"}},
		{"a name with a slash is refused", map[string]string{"a.yaml": head + "providers:\n" + strings.Replace(good, "sigstore-image-policy", "../bin/sigstore-image-policy", 1)},
			[]string{`providers[0].name: Invalid value: "../bin/sigstore-image-policy"`}},
		{"a provider declared in two files is named in both", map[string]string{"a.yaml": head + "providers:\n" + good, "b.yaml": head + "providers:\n" + good},
			[]string{`b.yaml: provider "sigstore-image-policy": providers[0].name: Duplicate value: "sigstore-image-policy": also declared in`, "a.yaml"}},
		{"two files with different default namespaces are refused", map[string]string{
			"a.yaml": head + "defaultNamespace: one\nproviders:\n" + good, "b.yaml": head + "defaultNamespace: two\nproviders:\n" + good},
			[]string{`defaultNamespace: Invalid value: "two"`, `already says "one"`}},
		{"a default namespace that is no namespace name is refused", map[string]string{"a.yaml": head + "defaultNamespace: Node_Pulls\nproviders:\n" + good},
			[]string{`defaultNamespace: Invalid value: "Node_Pulls"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := LoadConfig(dir, testBin)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
	t.Run("an empty directory is refused", func(t *testing.T) {
		if _, err := LoadConfig(t.TempDir(), testBin); err == nil || !strings.Contains(err.Error(), "no *.json, *.yaml or *.yml file") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("no path is refused", func(t *testing.T) {
		if _, err := LoadConfig("", testBin); err == nil {
			t.Error("loaded")
		}
	})
}

func TestConfigHash(t *testing.T) {
	t.Parallel()
	a, err := LoadConfig("testdata/config/full.yaml", testBin)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadConfig("testdata/config/defaults.yaml", testBin)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := LoadConfig("testdata/config/full.yaml", testBin)
	if a.Hash == b.Hash || a.Hash != again.Hash {
		t.Errorf("hashes %s %s %s: the content, and only it, makes the hash", a.Hash, b.Hash, again.Hash)
	}
}
