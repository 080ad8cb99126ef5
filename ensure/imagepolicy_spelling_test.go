package ensure_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
)

// spellingEngine is the real image policy engine with one exec plugin,
// "signed", that allows the signed image (by its manifest digest or ID)
// and refuses every other, for namespaces secure, locked and staging and
// registry.test, localhost:5000 and [fd00::1]:5000; locked's
// noMatchPolicy is Deny, staging's Warn. requests holds what the plugin
// was asked, a line each.
func spellingEngine(t *testing.T) (engine *imagepolicy.Engine, reg *prometheus.Registry, requests string) {
	t.Helper()
	dir := t.TempDir()
	requests = filepath.Join(dir, "requests")
	plugin := fmt.Sprintf(`#!/bin/sh
req=$(cat)
printf '%%s\n' "$req" >>%s
case "$req" in
*%s*|*%s*) echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}' ;;
*) echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":false,"reason":"no signature","podReason":"image is not signed"}' ;;
esac
`, requests, manifestDigest(refSigned), refSigned)
	if err := os.WriteFile(filepath.Join(dir, "signed"), []byte(plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfgFile, []byte(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
noMatchPolicy:
  namespaces: {locked: Deny, staging: Warn}
providers:
  - name: signed
    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1
    matchImages: ["registry.test", "localhost:5000", "[fd00::1]:5000"]
    namespaces: [secure, locked, staging]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := imagepolicy.LoadConfig(cfgFile, dir)
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	if engine, err = imagepolicy.New(cfg, imagepolicy.Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	return engine, reg, requests
}

// decisions is cri_image_proxy_image_policy_decisions_total for result.
func decisions(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "cri_image_proxy_image_policy_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelOf(m, "result") == result {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// spellings are names of the covered registries that the runtime reaches
// as it reaches them, and the repository the plugin is told for each.
var spellings = []struct{ host, told string }{
	{"registry.test", "registry.test"},
	{"REGISTRY.TEST", "registry.test"},
	{"Registry.Test:443", "registry.test:443"},
	{"registry.test:80", "registry.test:80"},
	{"LOCALHOST:5000", "localhost:5000"},
	{"[FD00:0:0::1]:5000", "[fd00::1]:5000"},
}

// imagePolicyPath is one way image policy sits on the CRI path: the guard
// (ensure on) or image policy's own hooks (ensure off: cri.Hooks), over a
// fake node serving every spelling of the signed and unsigned images.
type imagePolicyPath struct {
	node *fakeNode
	pull func(p pod, image string) error
	// create creates a container of ref, named image by the pod.
	create func(p pod, ref, image string) error
}

func imagePolicyPaths(t *testing.T, engine cri.Policy, serve func(n *fakeNode)) map[string]imagePolicyPath {
	ctx := context.Background()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked = true
	serve(s.node)
	s.imagePolicy = engine
	s.restart(t, decision.NeverVerifyPreloadedImages)
	n := newFakeNode()
	serve(n)
	h := cri.NewHooks(engine, nil, n, crireq.RuntimeImages(n), slog.New(slog.DiscardHandler))
	return map[string]imagePolicyPath{
		"ensure on": {node: s.node,
			pull: func(p pod, image string) error {
				_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, SandboxConfig: p.sandbox()}, s.runtimePull)
				return toStatus(err)
			},
			create: func(p pod, ref, image string) error { return s.create(p, ref, image) },
		},
		"ensure off": {node: n,
			pull: func(p pod, image string) error {
				_, err := h.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, SandboxConfig: p.sandbox()}, n.PullImage)
				return toStatus(err)
			},
			create: func(p pod, ref, image string) error {
				cfg := &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: image}}
				_, err := h.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: cfg, SandboxConfig: p.sandbox()}, n.CreateContainer)
				return toStatus(err)
			},
		},
	}
}

// TestImagePolicyDecidesEverySpellingOfARegistryAlike: an image named
// with another spelling of a covered registry (its host's case, https's
// or http's default port, an IPv6 literal written otherwise, an explicit
// port in the pattern) is decided as the canonical spelling is, at pull
// and at create, with ensure on and off: the unsigned image is refused
// before the runtime pulls and at create by name and by ID; the signed
// one runs.
func TestImagePolicyDecidesEverySpellingOfARegistryAlike(t *testing.T) {
	t.Parallel()
	for _, sp := range spellings {
		for _, mode := range []string{"ensure on", "ensure off"} {
			t.Run(sp.host+", "+mode, func(t *testing.T) {
				t.Parallel()
				signed, unsigned := sp.host+"/public/signed:v1", sp.host+"/public/unsigned:v1"
				engine, _, requests := spellingEngine(t)
				x := imagePolicyPaths(t, engine, func(n *fakeNode) {
					n.serve(signed, refSigned, "")
					n.serve(unsigned, refUnsigned, "")
				})[mode]
				err := x.pull(podSecure, unsigned)
				if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "image is not signed") || !strings.Contains(st.Message(), unsigned) {
					t.Errorf("the pull of %s: %v, want PermissionDenied naming it and the policy's reason", unsigned, err)
				}
				// With ensure off the policy decides before the runtime pulls;
				// with ensure on, beside the runtime's pull, and what it left is
				// refused at create (below).
				if n := x.node.registryRequests(); mode == "ensure off" && n != 0 {
					t.Errorf("the runtime pulled %d times", n)
				}
				b, _ := os.ReadFile(requests)
				if !strings.Contains(string(b), `"repository":"`+sp.told+`/public/unsigned"`) {
					t.Errorf("the plugin was not told %s/public/unsigned:\n%s", sp.told, b)
				}
				// On the node by another namespace's pull: refused at create,
				// by the name and by ID.
				if err := x.pull(podOther, unsigned); err != nil {
					t.Fatalf("another namespace's pull: %v", err)
				}
				for _, ref := range []string{unsigned, refUnsigned} {
					if err := x.create(podSecure, ref, unsigned); status.Code(err) != codes.PermissionDenied {
						t.Errorf("a container of %s: %v, want PermissionDenied", ref, err)
					}
				}
				if err := x.pull(podSecure, signed); err != nil {
					t.Fatalf("the signed pull: %v", err)
				}
				if err := x.create(podSecure, refSigned, signed); err != nil {
					t.Errorf("the signed create: %v", err)
				}
			})
		}
	}
}

// TestImagePolicyNoMatchPolicyOnTheCRIPath: an image of a registry no
// provider names (another name of the registry, an IP address, a mirror)
// is refused in a Deny namespace at pull (before any registry question
// with ensure off) and at create, and allowed and counted in a Warn
// namespace; a covered signed image runs in the Deny namespace.
func TestImagePolicyNoMatchPolicyOnTheCRIPath(t *testing.T) {
	t.Parallel()
	const alias = "10.0.0.5:5000/public/unsigned:v1"
	locked, staging := pod{uid: "l1", ns: "locked"}, pod{uid: "st1", ns: "staging"}
	for _, mode := range []string{"ensure on", "ensure off"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			engine, reg, _ := spellingEngine(t)
			x := imagePolicyPaths(t, engine, func(n *fakeNode) {
				n.serve(signedImage, refSigned, "")
				n.serve(alias, refUnsigned, "")
			})[mode]
			err := x.pull(locked, alias)
			if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), alias) ||
				!strings.Contains(st.Message(), `no image policy covers this image, and namespace "locked" runs only images a policy covers`) {
				t.Errorf("the pull in locked: %v", err)
			}
			if mode == "ensure off" && x.node.registryChecks() != 0 {
				t.Errorf("the registry was asked %d times for an image no provider covers", x.node.registryChecks())
			}
			if n := x.node.registryRequests(); n != 0 {
				t.Errorf("the runtime pulled %d times", n)
			}
			if err := x.pull(staging, alias); err != nil {
				t.Errorf("the pull in staging: %v, want allowed", err)
			}
			if err := x.create(staging, refUnsigned, alias); err != nil {
				t.Errorf("the create in staging: %v, want allowed", err)
			}
			if n := decisions(t, reg, "no_provider_warned"); n != 2 {
				t.Errorf("no_provider_warned decisions: %v, want 2 (the pull and the create)", n)
			}
			for _, ref := range []string{alias, refUnsigned} {
				if err := x.create(locked, ref, alias); status.Code(err) != codes.PermissionDenied {
					t.Errorf("a container of %s in locked: %v, want PermissionDenied", ref, err)
				}
			}
			if decisions(t, reg, "no_provider_denied") < 3 {
				t.Errorf("no_provider_denied decisions: %v", decisions(t, reg, "no_provider_denied"))
			}
			if err := x.pull(locked, signedImage); err != nil {
				t.Fatalf("the signed pull in locked: %v", err)
			}
			if err := x.create(locked, refSigned, signedImage); err != nil {
				t.Errorf("the signed create in locked: %v", err)
			}
		})
	}
}
