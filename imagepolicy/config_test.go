package imagepolicy

import (
	"fmt"
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
		noMatch   NoMatchRules
	}{
		{"a file with every field decodes them", "testdata/config/full.yaml", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1",
			MatchImages: []string{"*.registry.test", "127.0.0.1:5000"}, Namespaces: []string{"secure", "payments"},
			Timeout: 10 * time.Second, FailurePolicy: Ignore, AllowCacheDuration: 2 * time.Hour, DenyCacheDuration: 0,
			SendCredentials: true, Args: []string{"--policy", "/etc/cri-image-proxy/sigstore-policy.yaml"}, Env: []EnvVar{{"MODE", "strict"}},
			WatchFiles: []string{}, WatchFilesFromArgs: true, // the policy file is absent here
			File: "testdata/config/full.yaml",
		}}, "node-pulls", NoMatchRules{Default: NoMatchWarn, Namespaces: map[string]NoMatchPolicy{"secure": NoMatchDeny, "dev": NoMatchAllow}}},
		{"a minimal file gets the defaults: 30s, Fail, 1h allow, 1m deny, no credentials", "testdata/config/defaults.yaml", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"registry.test"},
			Namespaces: []string{"*"}, Timeout: 30 * time.Second, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			WatchFiles: []string{}, WatchFilesFromArgs: true,
			File: "testdata/config/defaults.yaml",
		}}, "", NoMatchRules{Default: NoMatchAllow, Namespaces: map[string]NoMatchPolicy{}}},
		{"a directory's yaml and json files are read in lexicographic order, others ignored", "testdata/config/dir", []Provider{{
			Name: "sigstore-image-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"registry.test"},
			Namespaces: []string{"secure"}, Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			WatchFiles: []string{}, WatchFilesFromArgs: true,
			File: "testdata/config/dir/10-signatures.yaml",
		}, {
			Name: "other-policy", APIVersion: "imagepolicy.cri-image-proxy.io/v1alpha1", MatchImages: []string{"*.example.com"},
			Namespaces: []string{"*"}, Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: time.Hour, DenyCacheDuration: time.Minute,
			WatchFiles: []string{}, WatchFilesFromArgs: true,
			File: "testdata/config/dir/20-other.json",
		}}, "bake", NoMatchRules{Default: NoMatchAllow, Namespaces: map[string]NoMatchPolicy{}}},
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
			if diff := cmp.Diff(tc.noMatch, cfg.NoMatch); diff != "" {
				t.Errorf("noMatchPolicy (-want +got):\n%s", diff)
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
		{"a misspelt noMatchPolicy field is refused with its path", map[string]string{"a.yaml": head +
			"noMatchPolicy:\n  default: deny\n  namespaces:\n    secure: Refuse\n    '*': Deny\n    Bad_NS: Deny\n  namespace: {}\n"},
			[]string{`unknown field "noMatchPolicy.namespace"`}},
		{"every bad noMatchPolicy value is named", map[string]string{"a.yaml": head +
			"noMatchPolicy:\n  default: deny\n  namespaces:\n    secure: Refuse\n    '*': Deny\n    Bad_NS: Deny\n"},
			[]string{`a.yaml: noMatchPolicy.default: Unsupported value: "deny": supported values: "Allow", "Warn", "Deny"`,
				`noMatchPolicy.namespaces[secure]: Unsupported value: "Refuse"`,
				`noMatchPolicy.namespaces[*]: Invalid value: "Deny": "*" is no namespace: noMatchPolicy.default is the policy of every namespace not listed`,
				`noMatchPolicy.namespaces[Bad_NS]: Invalid value: "Bad_NS"`}},
		{"two files that disagree on a namespace's noMatchPolicy are refused, naming both", map[string]string{
			"a.yaml": head + "noMatchPolicy: {namespaces: {secure: Deny}}\n", "b.yaml": head + "noMatchPolicy: {namespaces: {secure: Warn}}\nproviders:\n" + good},
			[]string{`b.yaml: noMatchPolicy.namespaces[secure]: Invalid value: "Warn":`, `a.yaml already says "Deny"`}},
		{"two files that disagree on the default noMatchPolicy are refused", map[string]string{
			"a.yaml": head + "noMatchPolicy: {default: Deny}\nproviders:\n" + good, "b.yaml": head + "noMatchPolicy: {default: Allow}\n"},
			[]string{`b.yaml: noMatchPolicy.default: Invalid value: "Allow":`, `a.yaml already says "Deny"`}},
		{"a relative watched file is refused", map[string]string{"a.yaml": head + "providers:\n" + good + "    watchFiles: [keys/release.pub]\n"},
			[]string{`providers[0].watchFiles[0]: Invalid value: "keys/release.pub": an absolute path`}},
		{"a watched file whose directory does not exist is refused: it cannot be watched", map[string]string{"a.yaml": head + "providers:\n" + good + "    watchFiles: [/nonexistent-dir/release.pub]\n"},
			[]string{`providers[0].watchFiles[0]: Invalid value: "/nonexistent-dir/release.pub": cannot be watched: its directory /nonexistent-dir does not exist`}},
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

func TestLoadConfigNoMatchPolicyAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const head = "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\n"
	if err := os.WriteFile(filepath.Join(dir, "00-deny.yaml"), []byte(head+"noMatchPolicy:\n  namespaces: {secure: Deny, staging: Warn}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-same.yaml"), []byte(head+"noMatchPolicy:\n  namespaces: {secure: Deny}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir, testBin)
	if err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]NoMatchPolicy{"secure": NoMatchDeny, "staging": NoMatchWarn, "other": NoMatchAllow, "": NoMatchAllow} {
		if got := cfg.NoMatch.For(ns); got != want {
			t.Errorf("noMatchPolicy of %q: %s, want %s", ns, got, want)
		}
	}
	if len(cfg.Providers) != 0 {
		t.Errorf("providers %v", cfg.Providers)
	}
}

func TestLoadConfigWatchFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	keys := filepath.Join(dir, "keys")
	for _, p := range []string{policy, filepath.Join(dir, "plugin.log")} {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	const head = "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n  - name: sigstore-image-policy\n    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1\n    matchImages: [registry.test]\n    namespaces: [secure]\n"
	for _, tc := range []struct {
		name     string
		extra    string
		want     []string
		fromArgs bool
	}{
		{"without watchFiles, the absolute paths of existing files among the args are watched", fmt.Sprintf("    args: [--policy, %s, --registry-timeout=5s, relative.yaml, --log=%s, %s]\n", policy, filepath.Join(dir, "absent"), keys),
			[]string{policy}, true},
		{"a --flag=value argument's value counts", fmt.Sprintf("    args: [--policy=%s]\n", policy), []string{policy}, true},
		{"watchFiles replaces what args say, files and directories alike", fmt.Sprintf("    args: [--policy, %s]\n    watchFiles: [%s, %s/, %s]\n", policy, policy, keys, filepath.Join(dir, "not-yet.pub")),
			[]string{policy, keys, filepath.Join(dir, "not-yet.pub")}, false},
		{"an empty watchFiles watches nothing", fmt.Sprintf("    args: [--policy, %s]\n    watchFiles: []\n", policy), []string{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(file, []byte(head+tc.extra), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(file, testBin)
			if err != nil {
				t.Fatal(err)
			}
			p := cfg.Providers[0]
			if diff := cmp.Diff(tc.want, p.WatchFiles); diff != "" || p.WatchFilesFromArgs != tc.fromArgs {
				t.Errorf("watchFiles (-want +got):\n%s; from args %v", diff, p.WatchFilesFromArgs)
			}
		})
	}
}
