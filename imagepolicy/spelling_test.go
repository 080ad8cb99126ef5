package imagepolicy

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// TestEverySpellingOfACoveredHostIsDecidedAsIt: a repository named with
// another spelling of a covered registry (its host in upper case, with
// https's or http's default port, an IP literal written otherwise) is
// decided at pull and at create as the canonical spelling is: the same
// providers apply, the plugin is told one repository, and verdicts are
// shared between spellings that are the same host.
func TestEverySpellingOfACoveredHostIsDecidedAsIt(t *testing.T) {
	t.Parallel()
	cfg := &Config{Providers: []Provider{
		testProvider("sig", []string{"secure"}, "registry.example.com/team", "localhost:5000", "[fd00::1]:5000", "127.0.0.1:5001", "ports.example.com:443"),
	}}
	for _, tc := range []struct {
		name, repo string
		told       string // the repository the plugin is told
	}{
		{"the canonical spelling", "registry.example.com/team/app", "registry.example.com/team/app"},
		{"an upper-case host", "REGISTRY.EXAMPLE.COM/team/app", "registry.example.com/team/app"},
		{"a mixed-case host", "Registry.Example.Com/team/app", "registry.example.com/team/app"},
		{"https's default port", "registry.example.com:443/team/app", "registry.example.com:443/team/app"},
		{"plain http's default port", "registry.example.com:80/team/app", "registry.example.com:80/team/app"},
		{"upper case and a default port", "REGISTRY.example.com:443/team/app", "registry.example.com:443/team/app"},
		{"a default port with leading zeros", "registry.example.com:0443/team/app", "registry.example.com:443/team/app"},
		{"an explicit port in the pattern, spelt in upper case", "LOCALHOST:5000/app", "localhost:5000/app"},
		{"an explicit 443 in the pattern, the image without port", "ports.example.com/app", "ports.example.com/app"},
		{"an IPv6 literal written out", "[fd00:0:0:0:0:0:0:1]:5000/app", "[fd00::1]:5000/app"},
		{"an IPv6 literal in upper case", "[FD00::1]:5000/app", "[fd00::1]:5000/app"},
		{"an IPv4-mapped IPv6 literal of a covered IPv4 registry", "[::ffff:7f00:1]:5001/app", "127.0.0.1:5001/app"},
	} {
		t.Run(tc.name+" is decided at pull and at create", func(t *testing.T) {
			t.Parallel()
			te := newTestEngine(t, cfg)
			f := te.runners["sig"]
			f.set(policyapi.Deny("unsigned", "image is not signed"), nil)
			if !te.Applies("secure", tc.repo) {
				t.Errorf("Applies(secure, %s) = false", tc.repo)
			}
			for _, s := range []Subject{pull("secure", tc.repo, digestA), create("secure", tc.repo, imageID)} {
				v, err := te.Decide(context.Background(), s)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed || len(v.Decisions) != 1 || v.PodReason != "image is not signed" {
					t.Errorf("%s of %s: verdict %+v, want refused by sig", s.Call, tc.repo, v)
				}
				if got := f.last().Repository; got != tc.told {
					t.Errorf("%s: the plugin was told repository %q, want %q", s.Call, got, tc.told)
				}
				if got := f.last().Image; got != s.Image {
					t.Errorf("%s: the plugin was told image %q, want it as the request named it, %q", s.Call, got, s.Image)
				}
			}
			if x := te.Explain(create("secure", tc.repo, imageID)); !x.Providers[0].Applies || x.Repository != tc.told {
				t.Errorf("explain: %+v", x)
			}
		})
	}
	t.Run("spellings that are the same host share verdicts, and a pull's bound verdict answers the create by either", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		f := te.runners["sig"]
		v, _ := te.Decide(context.Background(), pull("secure", "registry.example.com/team/app", digestA))
		te.Bind(v, imageID)
		for _, repo := range []string{"REGISTRY.EXAMPLE.COM/team/app", "registry.example.com/team/app"} {
			if c, _ := te.Decide(context.Background(), create("secure", repo, imageID)); !c.Allowed || !c.Decisions[0].FromCache {
				t.Errorf("create as %s: %+v, want the pull's verdict from the cache", repo, c)
			}
		}
		if f.calls() != 1 {
			t.Errorf("the plugin ran %d times, want once", f.calls())
		}
	})
	t.Run("another port, another host and another path are still not covered", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		for _, repo := range []string{"registry.example.com:5000/team/app", "registry.example.com/other/app", "other.example.com/team/app", "[fd00::2]:5000/app", "ports.example.com:80/app"} {
			if te.Applies("secure", repo) {
				t.Errorf("Applies(secure, %s) = true", repo)
			}
		}
	})
}

func TestNoMatchPolicy(t *testing.T) {
	t.Parallel()
	cfg := &Config{DefaultNamespace: "node", NoMatch: NoMatchRules{Default: NoMatchAllow, Namespaces: map[string]NoMatchPolicy{
		"secure": NoMatchDeny, "staging": NoMatchWarn, "node": NoMatchDeny,
	}}, Providers: []Provider{testProvider("sig", []string{"secure", "staging"}, "registry.example.com")}}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		s         Subject
		allowed   bool
		policy    NoMatchPolicy
		result    string
		podReason string
	}{
		{"Deny refuses an image of a registry no provider names", pull("secure", "mirror.example.com/team/app", digestA), false, NoMatchDeny, "no_provider_denied",
			`no image policy covers this image, and namespace "secure" runs only images a policy covers`},
		{"Deny refuses it at create too", create("secure", "10.0.0.5:5000/team/app", imageID), false, NoMatchDeny, "no_provider_denied", "runs only images a policy covers"},
		{"Deny refuses a pull no registry was asked about (no digest)", Subject{Call: CallPullImage, Image: "mirror.example.com/app:v1", Repository: "mirror.example.com/app", Pod: Pod{Namespace: "secure"}},
			false, NoMatchDeny, "no_provider_denied", "runs only images a policy covers"},
		{"Warn allows it and counts it", pull("staging", "mirror.example.com/team/app", digestA), true, NoMatchWarn, "no_provider_warned", ""},
		{"Allow, the default, allows it", pull("other", "mirror.example.com/team/app", digestA), true, NoMatchAllow, "no_provider", ""},
		{"a pull without a pod is decided by the default namespace's policy", pull("", "mirror.example.com/team/app", digestA), false, NoMatchDeny, "no_provider_denied",
			`namespace "node" runs only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			te := newTestEngine(t, cfg)
			v, err := te.Decide(ctx, tc.s)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != tc.allowed || v.NoMatchPolicy != tc.policy || len(v.Decisions) != 0 || !strings.Contains(v.PodReason, tc.podReason) {
				t.Errorf("verdict %+v", v)
			}
			if !strings.Contains(v.Reason(), "noMatchPolicy is "+string(tc.policy)) {
				t.Errorf("reason %q", v.Reason())
			}
			if got := testutil.ToFloat64(te.metrics.decisions.WithLabelValues("", string(tc.s.Call), tc.result, "")); got != 1 {
				t.Errorf("%s decisions: %v", tc.result, got)
			}
			if !tc.allowed {
				if err := v.Err(); !strings.Contains(err.Error(), "runs only images a policy covers") {
					t.Errorf("Err() = %v", err)
				}
				if strings.Contains(v.PodReason, "mirror.example.com") || strings.Contains(v.PodReason, "registry.example.com") {
					t.Errorf("the pod reads a repository: %q", v.PodReason)
				}
			}
			warned := strings.Contains(te.log.String(), `level=WARN msg="image policy: no provider applies to an image; allowed by the namespace's noMatchPolicy Warn"`)
			if warned != (tc.policy == NoMatchWarn) {
				t.Errorf("warning logged %v, want %v:\n%s", warned, tc.policy == NoMatchWarn, te.log)
			}
			if te.runners["sig"].calls() != 0 {
				t.Error("a plugin ran")
			}
		})
	}
	t.Run("a covered image of a Deny namespace is decided by its provider", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		if v, _ := te.Decide(ctx, pull("secure", "REGISTRY.example.com:443/app", digestA)); !v.Allowed || len(v.Decisions) != 1 || v.NoMatchPolicy != "" {
			t.Errorf("verdict %+v", v)
		}
	})
	t.Run("an image known by ID only, in a Deny namespace without providers, is refused", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, &Config{NoMatch: NoMatchRules{Namespaces: map[string]NoMatchPolicy{"locked": NoMatchDeny}}})
		if v, _ := te.Decide(ctx, create("locked", "", imageID)); v.Allowed {
			t.Errorf("verdict %+v", v)
		}
	})
	t.Run("a subject a provider applies to still needs a digest or an image ID", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		s := Subject{Call: CallPullImage, Image: "registry.example.com/app:v1", Repository: "registry.example.com/app", Pod: Pod{Namespace: "secure"}}
		if v, err := te.Decide(ctx, s); err == nil || v.Allowed {
			t.Errorf("verdict %+v, err %v", v, err)
		}
	})
	t.Run("NoMatchPolicy says each namespace's, the default namespace's for none", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		for ns, want := range map[string]NoMatchPolicy{"secure": NoMatchDeny, "staging": NoMatchWarn, "other": NoMatchAllow, "": NoMatchDeny} {
			if got := te.NoMatchPolicy(ns); got != want {
				t.Errorf("NoMatchPolicy(%q) = %s, want %s", ns, got, want)
			}
		}
	})
	t.Run("Explain says what the no-match policy decides", func(t *testing.T) {
		t.Parallel()
		te := newTestEngine(t, cfg)
		for _, tc := range []struct{ ns, want string }{
			{"secure", `refused: no provider applies, and namespace "secure"'s noMatchPolicy is Deny`},
			{"staging", `allowed with a warning: no provider applies, and namespace "staging"'s noMatchPolicy is Warn`},
			{"other", "allowed: no provider applies"},
		} {
			x := te.Explain(pull(tc.ns, "mirror.example.com/app", digestA))
			if x.Verdict != tc.want || x.NoMatchPolicy != te.NoMatchPolicy(tc.ns) {
				t.Errorf("explain for %s: %+v", tc.ns, x)
			}
		}
	})
}
