package ensure_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/imagepolicytest"
)

const (
	signedImage   = "registry.test/public/signed:v1"
	unsignedImage = "registry.test/public/unsigned:v1"
	refSigned     = "sha256:5555555555555555555555555555555555555555555555555555555555555555"
	refUnsigned   = "sha256:6666666666666666666666666666666666666666666666666666666666666666"
)

var (
	podSecure  = pod{uid: "s1", ns: "secure"}
	podSecure2 = pod{uid: "s2", ns: "secure"}
	podOther   = pod{uid: "o1", ns: "other"}
)

// newPolicySetup is a checked guard (the registry's word, innermost) with
// an image policy for namespace secure, and public images, one signed.
func newPolicySetup(t *testing.T) (*setup, *imagepolicytest.Policy) {
	t.Helper()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked = true
	s.node.serve(signedImage, refSigned, "")
	s.node.serve(unsignedImage, refUnsigned, "")
	f := imagepolicytest.NewPolicy("secure")
	f.Sign(manifestDigest(refSigned))
	s.imagePolicy = f
	s.restart(t, decision.NeverVerifyPreloadedImages)
	return s, f
}

// create asks the guard for a container of image (as the kubelet names it:
// the image ID with the pod's name for it) mounting volumes.
func (s *setup) create(p pod, ref, userSpecified string, volumes ...string) error {
	cfg := &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: userSpecified}}
	for _, v := range volumes {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: "/vol", Image: &runtimeapi.ImageSpec{Image: v}})
	}
	_, err := s.guard.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: "sandbox-" + p.uid, Config: cfg, SandboxConfig: p.sandbox()}, s.node.CreateContainer)
	return toStatus(err)
}

// TestImagePolicyWithEnsure: with ensure on, every try of a pull is
// decided on the digest the registry resolved before the runtime pulls,
// and every image a container would see is decided for the pod's
// namespace, after ensure's own decision.
func TestImagePolicyWithEnsure(t *testing.T) {
	t.Parallel()
	t.Run("a signed image is pulled and runs; the pull is decided on the registry's digest, the create finds the bound verdict", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		if got := s.start(podSecure, signedImage, "IfNotPresent"); got != running {
			t.Fatalf("%s, want %s", got, running)
		}
		asked := f.Subjects()
		if len(asked) != 2 {
			t.Fatalf("asked %d times, want a pull and a create: %+v", len(asked), asked)
		}
		pull, create := asked[0], asked[1]
		if pull.Call != imagepolicy.CallPullImage || pull.Digest != manifestDigest(refSigned) || pull.Repository != "registry.test/public/signed" ||
			pull.Pod.Namespace != "secure" || pull.Pod.UID != "s1" || pull.Platform == nil {
			t.Errorf("the pull's subject: %+v", pull)
		}
		if create.Call != imagepolicy.CallCreateContainer || create.ImageID != refSigned || create.Repository != "registry.test/public/signed" || create.Digest != manifestDigest(refSigned) {
			t.Errorf("the create's subject: %+v", create)
		}
	})
	t.Run("an unsigned image is refused at pull, PermissionDenied with the pod's reason, and what the runtime pulled beside is refused at create", func(t *testing.T) {
		t.Parallel()
		s, _ := newPolicySetup(t)
		_, err := s.guard.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: unsignedImage}, SandboxConfig: podSecure.sandbox()}, s.runtimePull)
		st := status.Convert(toStatus(err))
		if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "image is not signed") || !strings.Contains(st.Message(), unsignedImage) {
			t.Errorf("got %v; want PermissionDenied naming the image and the policy's reason", err)
		}
		if s.node.has(refUnsigned) {
			if err := s.create(podSecure, refUnsigned, ""); status.Code(err) != codes.PermissionDenied {
				t.Errorf("the image the runtime left: created, %v", err)
			}
		}
	})
	t.Run("an unsigned image already on the node is refused at create, by tag, by ID and by a prefix of the ID", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		if got := s.start(podOther, unsignedImage, "IfNotPresent"); got != running {
			t.Fatalf("the other namespace's pod: %s", got)
		}
		for _, ref := range []string{unsignedImage, refUnsigned, strings.TrimPrefix(refUnsigned, "sha256:")[:12]} {
			f.Subjects()
			err := s.create(podSecure, ref, "")
			if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "image is not signed") {
				t.Errorf("%s: got %v, want PermissionDenied with the policy's reason", ref, err)
			}
			// By ID the repository comes from the runtime's names, so that
			// the providers of that repository apply, with its digest.
			if asked := f.Subjects(); len(asked) != 1 || asked[0].Repository != "registry.test/public/unsigned" || asked[0].Digest != manifestDigest(refUnsigned) || asked[0].ImageID != refUnsigned {
				t.Errorf("%s: asked %+v", ref, asked)
			}
		}
	})
	t.Run("a tag moved to an unsigned digest after a signed pull refuses the next pull", func(t *testing.T) {
		t.Parallel()
		s, _ := newPolicySetup(t)
		if got := s.start(podSecure, signedImage, "Always"); got != running {
			t.Fatalf("first pod: %s", got)
		}
		s.node.mu.Lock()
		s.node.remote[norm(signedImage)] = refUnsigned
		s.node.mu.Unlock()
		if got := s.start(podSecure2, signedImage, "Always"); got != errImagePull {
			t.Errorf("next pod: %s, want %s", got, errImagePull)
		}
	})
	t.Run("an unsigned image volume is refused, a signed one mounts", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		s.start(podOther, unsignedImage, "IfNotPresent")
		if got := s.start(podSecure, signedImage, "IfNotPresent"); got != running {
			t.Fatalf("%s", got)
		}
		f.Subjects()
		if err := s.create(podSecure, refSigned, signedImage, unsignedImage); status.Code(err) != codes.PermissionDenied {
			t.Errorf("unsigned volume: %v, want PermissionDenied", err)
		}
		if asked := f.Subjects(); len(asked) != 2 || asked[1].Call != imagepolicy.CallImageVolume {
			t.Errorf("asked %+v; want the image, then the volume as an ImageVolume", asked)
		}
		if err := s.create(podSecure, refSigned, signedImage, signedImage); err != nil {
			t.Errorf("signed volume: %v", err)
		}
	})
	t.Run("other namespaces are unaffected", func(t *testing.T) {
		t.Parallel()
		s, _ := newPolicySetup(t)
		for _, img := range []string{unsignedImage, signedImage} {
			if got := s.start(podOther, img, "Always"); got != running {
				t.Errorf("%s: %s", img, got)
			}
		}
	})
	t.Run("the pod's service account is told when the informer holds the pod", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		s.pods = &fakePods{pods: []*corev1.Pod{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "secure", Name: "pod-" + podSecure.uid, UID: types.UID(podSecure.uid)},
			Spec:       corev1.PodSpec{ServiceAccountName: "web"},
		}}}
		s.restart(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podSecure, signedImage, "IfNotPresent"); got != running {
			t.Fatalf("%s, want %s", got, running)
		}
		asked := f.Subjects()
		if len(asked) != 2 || asked[0].Pod.ServiceAccount != "web" || asked[1].Pod.ServiceAccount != "web" {
			t.Errorf("asked %+v; want the service account web at pull and at create", asked)
		}
	})
	t.Run("a static pod is said to be one", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		if got := s.start(pod{uid: "st", ns: "secure", static: true}, unsignedImage, "IfNotPresent"); got != errImagePull {
			t.Errorf("%s, want %s", got, errImagePull)
		}
		if asked := f.Subjects(); len(asked) == 0 || !asked[0].Pod.Static {
			t.Errorf("asked %+v; want a static pod", asked)
		}
	})
	t.Run("the runtime cannot say which image a name is: refused Unavailable where a policy applies, allowed elsewhere", func(t *testing.T) {
		t.Parallel()
		s, _ := newPolicySetup(t)
		s.start(podOther, signedImage, "IfNotPresent")
		s.node.setStatusErr(status.Error(codes.Unavailable, "containerd is restarting"))
		// By name: ensure allows an image anyone may pull without asking.
		if err := s.create(podSecure, signedImage, ""); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "image policy") {
			t.Errorf("secure: %v, want Unavailable from the image policy", err)
		}
		if err := s.create(podOther, signedImage, ""); err != nil {
			t.Errorf("other: %v, want allowed", err)
		}
	})
	t.Run("ensure decides first: a pod ensure refuses is never asked about", func(t *testing.T) {
		t.Parallel()
		s, f := newPolicySetup(t)
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		f.Subjects()
		if err := s.create(pod{uid: "b", ns: "secure"}, refApp, private); status.Code(err) != codes.PermissionDenied {
			t.Errorf("got %v, want ensure's refusal", err)
		}
		if asked := f.Subjects(); len(asked) != 0 {
			t.Errorf("the image policy was asked %+v", asked)
		}
	})
}

// TestImagePolicyEngineBindsThePullsVerdict: with the real engine and an
// exec plugin, a pod's pull runs the plugin once; its verdict, bound to
// the image ID the pull produced, answers the container's create; a pod of
// another namespace is asked anew.
func TestImagePolicyEngineBindsThePullsVerdict(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	plugin := "#!/bin/sh\ncat >/dev/null\necho run >>" + runs + "\n" +
		`echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}'` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "allow-all"), []byte(plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfgFile, []byte(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
providers:
  - name: allow-all
    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1
    matchImages: ["registry.test"]
    namespaces: [secure, payments]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := imagepolicy.LoadConfig(cfgFile, dir)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := imagepolicy.New(cfg, imagepolicy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked = true
	s.node.serve(signedImage, refSigned, "")
	s.imagePolicy = engine
	s.restart(t, decision.NeverVerifyPreloadedImages)
	countRuns := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "run")
	}
	if got := s.start(podSecure, signedImage, "IfNotPresent"); got != running {
		t.Fatalf("%s", got)
	}
	if n := countRuns(); n != 1 {
		t.Errorf("the plugin ran %d times for a pull and a create, want 1", n)
	}
	if got := s.start(podSecure2, signedImage, "IfNotPresent"); got != running || countRuns() != 1 {
		t.Errorf("a second pod of the namespace: %s, %d runs; want the cached verdict", got, countRuns())
	}
	for _, tc := range []struct{ image, namespace, want string }{
		{signedImage, "secure", "allowed: cached by every provider"},
		{refSigned, "secure", "allowed: cached by every provider"},
		{signedImage, "payments", "not cached: a decision runs allow-all"},
		{signedImage, "other", "allowed: no provider applies"},
	} {
		x, err := s.guard.ExplainPolicy(context.Background(), tc.image, tc.namespace)
		if err != nil || len(x.As) != 1 || !strings.Contains(x.As[0].Explanation.Verdict, tc.want) ||
			x.As[0].Repository != "registry.test/public/signed" || x.As[0].Digest != manifestDigest(refSigned) {
			t.Errorf("explain %s for %s: %+v, %v; want %q", tc.image, tc.namespace, x, err, tc.want)
		}
	}
	if err := s.create(pod{uid: "p1", ns: "payments"}, refSigned, signedImage); err != nil || countRuns() != 2 {
		t.Errorf("another namespace's create: %v, %d runs; want the plugin asked once more", err, countRuns())
	}
	if countRuns() != 2 {
		t.Errorf("explain ran the plugin")
	}
}
