package cri_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/imagepolicytest"
)

// hooks are image policy's own hooks over a node that serves the signed
// and the unsigned image, for a policy of namespace secure.
type hooks struct {
	node *node
	h    *cri.Hooks
	f    *imagepolicytest.Policy
}

func newHooks() hooks {
	n := newNode()
	n.serve(signedImage, refSigned)
	n.serve(unsignedImage, refUnsigned)
	f := imagepolicytest.NewPolicy("secure")
	f.Sign(manifestDigest(refSigned))
	return hooks{n, cri.NewHooks(f, nil, n, n, slog.New(slog.DiscardHandler)), f}
}

// pull pulls image for p through the hooks, the runtime's pull being next.
func (x hooks) pull(p pod, image string, next func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error)) error {
	_, err := x.h.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, SandboxConfig: p.sandbox()}, next)
	return criproxy.ToStatus(err)
}

// create creates a container of ref for p, mounting image volumes.
func (x hooks) create(p pod, ref string, volumes ...string) error {
	cfg := &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: ref}}
	for _, v := range volumes {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: "/vol", Image: &runtimeapi.ImageSpec{Image: v}})
	}
	_, err := x.h.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{Config: cfg, SandboxConfig: p.sandbox()}, x.node.CreateContainer)
	return criproxy.ToStatus(err)
}

// TestImagePolicyWithoutEnsure: with ensure off, the hooks make the
// guard's decisions with a registry check and runtime questions of their
// own; a namespace without a policy asks neither.
func TestImagePolicyWithoutEnsure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, x hooks)
	}{
		{"a signed image is pulled, then created from the bound verdict", func(t *testing.T, x hooks) {
			if err := x.pull(podSecure, signedImage, x.node.PullImage); err != nil {
				t.Fatal(err)
			}
			if !x.f.IsBound(refSigned, "secure") {
				t.Errorf("the pull's verdict is not bound to the image it produced")
			}
			if err := x.create(podSecure, refSigned); err != nil {
				t.Errorf("create: %v", err)
			}
			if checks, _ := x.node.counts(); checks != 1 {
				t.Errorf("%d registry checks, want 1", checks)
			}
			asked := x.f.Subjects()
			if len(asked) != 2 || asked[0].Digest != manifestDigest(refSigned) || asked[0].Repository != "registry.test/public/signed" || asked[0].Platform == nil ||
				asked[1].ImageID != refSigned || asked[1].Repository != "registry.test/public/signed" || asked[1].Digest != manifestDigest(refSigned) {
				t.Errorf("asked %+v; want the pull on the registry's digest, the create on the runtime's answer", asked)
			}
		}},
		{"an unsigned image is refused at pull, PermissionDenied with the pod's reason, and the runtime never pulls", func(t *testing.T, x hooks) {
			err := x.pull(podSecure, unsignedImage, x.node.PullImage)
			if status.Code(err) != codes.PermissionDenied || !contains(err, unsignedImage, "image is not signed") {
				t.Errorf("got %v, want PermissionDenied naming the image and the policy's reason", err)
			}
			if _, pulls := x.node.counts(); pulls != 0 {
				t.Errorf("the runtime pulled")
			}
		}},
		{"an unsigned image already on the node is refused at create, and as an image volume", func(t *testing.T, x hooks) {
			if err := x.pull(podOther, unsignedImage, x.node.PullImage); err != nil {
				t.Fatal(err)
			}
			if err := x.pull(podSecure, signedImage, x.node.PullImage); err != nil {
				t.Fatal(err)
			}
			for _, ref := range []string{refUnsigned, unsignedImage} {
				if err := x.create(podSecure, ref); status.Code(err) != codes.PermissionDenied {
					t.Errorf("%s: %v, want PermissionDenied", ref, err)
				}
			}
			if err := x.create(podSecure, refSigned, refUnsigned); status.Code(err) != codes.PermissionDenied {
				t.Errorf("volume: %v, want PermissionDenied", err)
			}
		}},
		{"the tag moved between the registry's answer and the runtime's pull: Aborted, nothing bound", func(t *testing.T, x hooks) {
			err := x.pull(podSecure, signedImage, func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				x.node.put(signedImage, refUnsigned)
				return &runtimeapi.PullImageResponse{ImageRef: refUnsigned}, nil
			})
			if status.Code(err) != codes.Aborted {
				t.Errorf("got %v, want Aborted", err)
			}
			if x.f.IsBound(refUnsigned, "secure") || x.f.IsBound(refSigned, "secure") {
				t.Errorf("a verdict was bound")
			}
			if err := x.create(podSecure, refUnsigned); status.Code(err) != codes.PermissionDenied {
				t.Errorf("create of what the runtime pulled: %v, want PermissionDenied", err)
			}
		}},
		{"a registry that cannot be asked refuses the pull where a policy applies", func(t *testing.T, x hooks) {
			x.node.registryErr = errors.New("dial tcp: connection refused")
			if err := x.pull(podSecure, signedImage, x.node.PullImage); err == nil {
				t.Errorf("pulled")
			}
			if err := x.pull(podOther, signedImage, x.node.PullImage); err != nil {
				t.Errorf("other namespace: %v", err)
			}
		}},
		{"the runtime cannot say which image a name is: refused Unavailable where a policy applies, allowed elsewhere", func(t *testing.T, x hooks) {
			x.node.put(signedImage, refSigned)
			x.node.statusErr = status.Error(codes.Unavailable, "containerd is restarting")
			if err := x.create(podSecure, signedImage); status.Code(err) != codes.Unavailable || !contains(err, "image policy") {
				t.Errorf("secure: %v, want Unavailable from the image policy", err)
			}
			if err := x.create(podOther, signedImage); err != nil {
				t.Errorf("other: %v, want allowed", err)
			}
		}},
		{"a namespace without a policy asks neither the registry nor the runtime", func(t *testing.T, x hooks) {
			x.node.statusErr = status.Error(codes.Unavailable, "down")
			if err := x.pull(podOther, unsignedImage, x.node.PullImage); err != nil {
				t.Fatal(err)
			}
			if err := x.create(podOther, refUnsigned); err != nil {
				t.Errorf("create: %v", err)
			}
			if checks, _ := x.node.counts(); checks != 0 || len(x.f.Subjects()) != 0 {
				t.Errorf("%d registry checks, the policy asked", checks)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newHooks())
		})
	}
}

// pods is the informer's cache (cri.Pods): the pods it holds, by UID.
type pods map[string]*corev1.Pod

func (p pods) CachedPod(namespace, name, uid string) *corev1.Pod {
	if pod := p[uid]; pod != nil && pod.Namespace == namespace && pod.Name == name {
		return pod
	}
	return nil
}

// TestThePluginsAreToldThePodsServiceAccount: with ensure off, as with it
// on, the plugins are told the service account of a pod the informer
// holds, at pull and at create; without the API, or for a pod it does not
// hold, none.
func TestThePluginsAreToldThePodsServiceAccount(t *testing.T) {
	t.Parallel()
	cached := pods{podSecure.uid: {
		ObjectMeta: metav1.ObjectMeta{Namespace: podSecure.ns, Name: "pod-" + podSecure.uid, UID: types.UID(podSecure.uid)},
		Spec:       corev1.PodSpec{ServiceAccountName: "web"},
	}}
	for _, tc := range []struct {
		name string
		pods cri.Pods
		pod  pod
		want string
	}{
		{"a pod the informer holds: its service account", cached, podSecure, "web"},
		{"a pod the informer does not hold: none", cached, pod{uid: "s2", ns: "secure"}, ""},
		{"no Kubernetes API: none", nil, podSecure, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := newNode()
			n.serve(signedImage, refSigned)
			f := imagepolicytest.NewPolicy("secure")
			f.Sign(manifestDigest(refSigned))
			x := hooks{n, cri.NewHooks(f, tc.pods, n, n, slog.New(slog.DiscardHandler)), f}
			if err := x.pull(tc.pod, signedImage, n.PullImage); err != nil {
				t.Fatal(err)
			}
			if err := x.create(tc.pod, refSigned); err != nil {
				t.Fatal(err)
			}
			asked := f.Subjects()
			if len(asked) != 2 {
				t.Fatalf("asked %+v; want a pull and a create", asked)
			}
			for _, s := range asked {
				if s.Pod.ServiceAccount != tc.want || s.Pod.UID != tc.pod.uid {
					t.Errorf("%s: told the pod %+v, want service account %q", s.Call, s.Pod, tc.want)
				}
			}
		})
	}
}
