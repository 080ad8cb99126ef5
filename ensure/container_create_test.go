package ensure_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

// createWithMounts asks the guard to create a container of image for p
// with image volume mounts of mounts (names or IDs), and returns the gRPC
// code the client would see.
func createWithMounts(s *setup, p pod, image string, mounts ...string) (codes.Code, error) {
	cfg := &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: image}}
	for i, m := range mounts {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{ContainerPath: "/vol" + string(rune('0'+i)), Readonly: true, Image: &runtimeapi.ImageSpec{Image: m}})
	}
	_, err := s.guard.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{Config: cfg, SandboxConfig: p.sandbox()}, s.node.CreateContainer)
	return status.Code(toStatus(err)), err
}

func TestImageVolumesGetTheSameDecisionAsTheImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pod    pod
		mounts []string
		want   codes.Code
	}{
		{"a mount of another tenant's private image by name is refused", podB, []string{private}, codes.PermissionDenied},
		{"a mount of it by image ID is refused", podB, []string{refApp}, codes.PermissionDenied},
		{"a mount of it by a prefix of its ID is refused", podB, []string{refApp[7:19]}, codes.PermissionDenied},
		{"a mount of it by a prefix of its ID with the algorithm is refused", podB, []string{refApp[:19]}, codes.PermissionDenied},
		{"a public mount next to a private one is still refused", podB, []string{public, private}, codes.PermissionDenied},
		{"the pod that pulled the image may mount it", podA, []string{private}, codes.OK},
		{"the pod that pulled the image may mount it by ID", podA, []string{refApp}, codes.OK},
		{"any pod may mount a public image", podB, []string{public}, codes.OK},
		{"a mount of an image the node does not have is left to the runtime", podB, []string{"registry.test/absent:v1"}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			if r := s.start(podA, private, "IfNotPresent"); r != running {
				t.Fatalf("A's own pull: %s", r)
			}
			if r := s.start(podB, public, "IfNotPresent"); r != running {
				t.Fatalf("B's public image: %s", r)
			}
			code, err := createWithMounts(s, tc.pod, public, tc.mounts...)
			if code != tc.want {
				t.Errorf("got %v (%v), want %v", code, err, tc.want)
			}
			if code == codes.PermissionDenied && !strings.Contains(err.Error(), tc.pod.uid) {
				t.Errorf("the refusal does not name the pod: %v", err)
			}
		})
	}
}

func TestARuntimeThatCannotAnswerRefusesWhatMayNeedVerification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy decision.PolicyName
		image  string
		mounts []string
		want   codes.Code
	}{
		{"a restricted image by name is refused with Unavailable", decision.NeverVerifyPreloadedImages, private, nil, codes.Unavailable},
		{"an image by ID is refused with Unavailable", decision.NeverVerifyPreloadedImages, refApp, nil, codes.Unavailable},
		{"a name that may be an ID prefix is refused with Unavailable", decision.NeverVerifyPreloadedImages, "deadbeef", nil, codes.Unavailable},
		{"an image mount that may need verification is refused with Unavailable", decision.NeverVerifyPreloadedImages, public, []string{refApp}, codes.Unavailable},
		{"every image needs verification under AlwaysVerify", decision.AlwaysVerify, public, nil, codes.Unavailable},
		{"a repository no record restricts is forwarded (the runtime answers for itself)", decision.NeverVerifyPreloadedImages, public, nil, codes.OK},
		{"nothing is checked under NeverVerify", decision.NeverVerify, refApp, []string{private}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, tc.policy)
			s.start(podA, private, "IfNotPresent")
			s.start(podB, public, "IfNotPresent") // anonymous: accessible to every pod
			s.node.statusErr = status.Error(codes.Unavailable, "connection refused")
			code, err := createWithMounts(s, podA, tc.image, tc.mounts...)
			if code != tc.want {
				t.Errorf("got %v (%v), want %v", code, err, tc.want)
			}
		})
	}
	t.Run("an answer about an image volume's name itself is left to the runtime's own error", func(t *testing.T) {
		s := newSetup(t, decision.AlwaysVerify)
		s.start(podB, public, "IfNotPresent")
		if code, err := createWithMounts(s, podB, public, "Not_A_Reference"); code != codes.OK {
			t.Errorf("got %v (%v); want it forwarded", code, err)
		}
	})
	t.Run("an Unknown about a name that can name no image is the runtime's answer (containerd 1.6), not an outage", func(t *testing.T) {
		for _, tc := range []struct {
			image string
			want  codes.Code
		}{
			{"Not A Name", codes.PermissionDenied},
			{"/var/lib/Checkpoint.tar", codes.PermissionDenied},
			{private, codes.Unavailable},    // a name that may be an image: still no answer
			{"deadbeef", codes.Unavailable}, // an ID prefix likewise
		} {
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			s.start(podA, private, "IfNotPresent")
			s.node.statusErr = status.Error(codes.Unknown, "invalid image reference")
			code, err := createWithMounts(s, podA, tc.image)
			if code != tc.want {
				t.Errorf("%q: got %v (%v), want %v", tc.image, code, err, tc.want)
			}
			if code == codes.PermissionDenied && strings.Contains(s.log.String(), "cannot answer") {
				t.Errorf("%q: the log blames the runtime: %s", tc.image, s.log.String())
			}
		}
	})
	t.Run("a container image the runtime cannot parse is refused (it may be a checkpoint archive's path)", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		if code, err := createWithMounts(s, podA, "/var/lib/Checkpoint.tar"); code != codes.PermissionDenied {
			t.Errorf("got %v (%v)", code, err)
		}
	})
}

func TestAContainerImageTheNodeDoesNotHaveIsRefused(t *testing.T) {
	t.Parallel()
	// containerd restores a file it finds at the image "name" as a
	// checkpoint archive, absolute or relative to its working directory.
	for _, image := range []string{"/var/lib/kubelet/checkpoints/checkpoint-app.tar", "var/lib/kubelet/checkpoints/checkpoint-app.tar", "registry.test/absent:v1"} {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		if code, err := createWithMounts(s, podA, image); code != codes.PermissionDenied {
			t.Errorf("%s: got %v (%v)", image, code, err)
		}
		s = newSetup(t, decision.NeverVerify)
		if code, err := createWithMounts(s, podA, image); code != codes.OK {
			t.Errorf("%s under NeverVerify: got %v (%v)", image, code, err)
		}
	}
}

func TestWaitingImageVolumesCountAsUsesOfTheImage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	volumePod := func(ns, name, uid string, policy corev1.PullPolicy, secrets ...string) *corev1.Pod {
		p := policyPod(ns, name, uid, "", public, corev1.PullIfNotPresent, secrets...)
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: private, PullPolicy: policy}}}}
		return p
	}
	shown := func(s *apiSetup) bool {
		st, err := s.guard.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
		if err != nil {
			t.Fatal(err)
		}
		return st.GetImage() != nil
	}
	t.Run("an entitled Never volume pod is shown the image, whoever else waits; a non-entitled IfNotPresent volume pod pulls once it no longer waits", func(t *testing.T) {
		s := newAPISetup(t)
		s.start(podA, private, "IfNotPresent")
		s.create(t, pullSecret("ta", "regcred", "registry.test", "alice:a-pw"),
			volumePod("ta", "vol-a", "va", corev1.PullNever, "regcred"))
		if !shown(s) {
			t.Fatalf("the entitled volume pod is not shown the image")
		}
		s.create(t, volumePod("tb", "vol-b", "vb", corev1.PullIfNotPresent))
		if !shown(s) {
			t.Errorf("a waiting IfNotPresent volume pod without credentials hid the image from an entitled Never pod")
		}
		if err := s.client.CoreV1().Pods("ta").Delete(ctx, "vol-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		s.create(t)
		if shown(s) {
			t.Errorf("a waiting IfNotPresent volume pod without credentials was shown the image: it would skip its pull")
		}
	})
	t.Run("a non-entitled Never volume pod does not keep it hidden, and is refused at CreateContainer", func(t *testing.T) {
		s := newAPISetup(t)
		s.start(podA, private, "IfNotPresent")
		s.start(podB, public, "IfNotPresent") // the containers' own image: public, on the node
		s.create(t, pullSecret("ta", "regcred", "registry.test", "alice:a-pw"),
			volumePod("ta", "vol-a", "va", corev1.PullNever, "regcred"),
			volumePod("tb", "vol-b", "vb", corev1.PullNever))
		if !shown(s) {
			t.Fatalf("not shown")
		}
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: public},
				Mounts: []*runtimeapi.Mount{{ContainerPath: "/vol", Readonly: true, Image: &runtimeapi.ImageSpec{Image: private}}}},
			SandboxConfig: sandbox("tb", "vol-b", "vb")}, s.node.CreateContainer)
		if status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("B's volume container: %v", err)
		}
		_, err = s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: public},
				Mounts: []*runtimeapi.Mount{{ContainerPath: "/vol", Readonly: true, Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}}}},
			SandboxConfig: sandbox("ta", "vol-a", "va")}, s.node.CreateContainer)
		if err != nil {
			t.Errorf("A's entitled volume container: %v", err)
		}
	})
}

func TestARecordThatCannotBeWrittenLeavesTheImageNeedingVerification(t *testing.T) {
	t.Parallel()
	t.Run("B is refused by image ID when the same image is also public under another name", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		const open = "registry.test/open/app:v1"
		s.node.serve(open, refApp, "")
		if r := s.start(podB, open, "IfNotPresent"); r != running {
			t.Fatalf("B's anonymous pull: %s", r)
		}
		s.store.(*ensuretest.MemoryStore).FailWrites = errors.New("no space left on device")
		if r := s.start(podA, private, "IfNotPresent"); r != running {
			t.Fatalf("A's pull: %s", r)
		}
		if code, err := createWithMounts(s, podBOwn, refApp); code != codes.PermissionDenied {
			t.Errorf("a pod that never pulled, by ID: %v (%v)", code, err)
		}
	})
	for _, tc := range []struct {
		name   string
		lookup string // how B's container names the image
	}{
		{"by name", private},
		{"by image ID", refApp},
	} {
		t.Run("B is refused "+tc.name+" after A's record failed to write", func(t *testing.T) {
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			s.store.(*ensuretest.MemoryStore).FailWrites = errors.New("no space left on device")
			if r := s.start(podA, private, "IfNotPresent"); r != running {
				t.Fatalf("A's pull: %s", r)
			}
			st, err := s.guard.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.nodeImageStatus)
			if err != nil || st.GetImage() != nil {
				t.Errorf("ImageStatus showed the image as preloaded: %v %v", st.GetImage(), err)
			}
			if code, err := createWithMounts(s, podB, tc.lookup); code != codes.PermissionDenied {
				t.Errorf("B's container: %v (%v)", code, err)
			}
			if code, err := createWithMounts(s, podB, public, tc.lookup); code != codes.PermissionDenied {
				t.Errorf("B's image volume: %v (%v)", code, err)
			}
			if code, err := createWithMounts(s, podA, tc.lookup); code != codes.OK {
				t.Errorf("A, who pulled it: %v (%v)", code, err)
			}
		})
	}
}
