package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestImageSpecSurvivesTheProxy: the proxy decodes PullImage and
// CreateContainer (credential injection, ensure) and re-encodes them; every
// field of the ImageSpec (runtime_handler, annotations,
// user_specified_image) must reach the runtime unchanged, as far as it
// shows what it got (containerd keeps the spec whole, CRI-O the image and,
// by needing it, user_specified_image), and the records must stay right
// when one image is pulled for two runtime handlers.
func TestImageSpecSurvivesTheProxy(t *testing.T) {
	needRig(t)
	if testRig.Runtime.Legacy() {
		t.Skipf("SKIPPED: %s has no per-handler snapshotters", testRig.Runtime.Name)
	}
	p := startEnsureProxy(t, "imagespec")
	conn, err := rig.DialCRI(p.ep)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	images, runtime := runtimeapi.NewImageServiceClient(conn), runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := testRig.PushBusybox("team-a/spec:v1", "imagespec"); err != nil {
		t.Fatal(err)
	}
	img := testRig.Registry + "/team-a/spec:v1"
	alice := &runtimeapi.AuthConfig{Username: "alice", Password: rig.Users["alice"]}
	bob := &runtimeapi.AuthConfig{Username: "bob", Password: rig.Users["bob"]}
	pull := func(handler string, auth *runtimeapi.AuthConfig, uid string) string {
		t.Helper()
		resp, err := images.PullImage(ctx, &runtimeapi.PullImageRequest{
			Image: &runtimeapi.ImageSpec{Image: img, RuntimeHandler: handler, UserSpecifiedImage: img,
				Annotations: map[string]string{"e2e.test/pulled-for": handler}},
			Auth: auth, SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: uid, Namespace: "e2e", Uid: uid}},
		})
		if err != nil {
			t.Fatalf("pull for %q: %v", handler, err)
		}
		return resp.ImageRef
	}

	var ref string
	t.Run("a pull for a runtime handler reaches containerd with it: the image unpacks into that handler's snapshotter", func(t *testing.T) {
		if testRig.Runtime.CRIO() {
			t.Skipf("n/a on %s: its runtime handlers share one image store, so where a pull for a handler went cannot be seen", testRig.Runtime.Name)
		}
		if testRig.Snapshotter == "native" {
			t.Skip("SKIPPED: the default snapshotter is native too; the handler cannot be told on disk")
		}
		before := testRig.NativeSnapshots()
		ref = pull(rig.AltRuntimeHandler, alice, "spec-a")
		if after := testRig.NativeSnapshots(); after <= before {
			t.Errorf("native snapshots %d -> %d: the runtime handler did not reach containerd", before, after)
		}
	})

	t.Run("the same image pulled for the default handler has the same ID, and its record holds both credentials", func(t *testing.T) {
		if ref == "" {
			ref = pull(rig.AltRuntimeHandler, alice, "spec-a")
		}
		if ref2 := pull("", bob, "spec-b"); ref2 != ref {
			t.Fatalf("image IDs differ: %s vs %s", ref, ref2)
		}
		out, err := p.records(t, "show", img)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var rec struct {
			ImageRef          string `json:"imageRef"`
			CredentialMapping map[string]struct {
				KubernetesSecrets []json.RawMessage `json:"kubernetesSecrets"`
			} `json:"credentialMapping"`
		}
		if err := json.Unmarshal([]byte(out), &rec); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		repo := testRig.Registry + "/team-a/spec"
		if !sameImage(rec.ImageRef, ref) || len(rec.CredentialMapping) != 1 || len(rec.CredentialMapping[repo].KubernetesSecrets) != 2 {
			t.Errorf("want one record of %s with two credentials for %s:\n%s", ref, repo, out)
		}
	})

	t.Run("for either handler, the image stays hidden from a pod without credentials", func(t *testing.T) {
		for _, h := range []string{"", rig.AltRuntimeHandler} {
			st, err := images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img, RuntimeHandler: h}})
			if err != nil || st.GetImage() != nil {
				t.Errorf("handler %q: ImageStatus %v, %v; want hidden", h, st.GetImage(), err)
			}
		}
	})

	t.Run("CreateContainer's image spec reaches the runtime as sent", func(t *testing.T) {
		podCfg := &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: "spec-a", Namespace: "e2e", Uid: "spec-a"},
			LogDirectory: t.TempDir(),
			Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
		}
		sb, err := runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: podCfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			runtime.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId})
			runtime.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
		})
		sent := &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: img, RuntimeHandler: "",
			Annotations: map[string]string{"e2e.test/kept": "yes", "e2e.test/empty": ""}}
		c, err := runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: podCfg,
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "spec"}, Image: sent, Command: []string{"true"}, Linux: &runtimeapi.LinuxContainerConfig{}}})
		if err != nil {
			t.Fatalf("the pod that pulled the image was refused: %v", err)
		}
		st, err := runtimeapi.NewRuntimeServiceClient(mustDial(t, direct())).ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.ContainerId, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		if testRig.Runtime.CRIO() {
			crioKeepsTheImageSpec(t, ctx, st, sb.PodSandboxId, podCfg, sent)
			return
		}
		var info struct {
			Config struct {
				Image json.RawMessage `json:"image"`
			} `json:"config"`
		}
		if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
			t.Fatalf("containerd's verbose info: %v", err)
		}
		got := &runtimeapi.ImageSpec{}
		if err := json.Unmarshal(info.Config.Image, got); err != nil {
			t.Fatalf("%v: %s", err, info.Config.Image)
		}
		if !proto.Equal(got, sent) {
			t.Errorf("containerd stored image spec %v, the client sent %v", got, sent)
		}
	})
}

// crioKeepsTheImageSpec is the check of CreateContainer's image spec on
// CRI-O, which keeps of it only the image it was asked for (the
// container's annotation io.kubernetes.cri-o.Image) and its annotations
// nowhere: user_specified_image is the name CRI-O checks its signature
// policy by, and it refuses a create without one (shown straight to it),
// so that the create through the proxy succeeded shows it arrived.
func crioKeepsTheImageSpec(t *testing.T, ctx context.Context, st *runtimeapi.ContainerStatusResponse, sandbox string, podCfg *runtimeapi.PodSandboxConfig, sent *runtimeapi.ImageSpec) {
	t.Helper()
	var info struct {
		RuntimeSpec struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
		t.Fatalf("CRI-O's verbose info: %v", err)
	}
	if got := info.RuntimeSpec.Annotations["io.kubernetes.cri-o.Image"]; got != sent.Image {
		t.Errorf("CRI-O created the container of image %q, the client sent %q", got, sent.Image)
	}
	rt := runtimeapi.NewRuntimeServiceClient(mustDial(t, direct()))
	c, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandbox, SandboxConfig: podCfg,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "spec-unnamed"}, Image: &runtimeapi.ImageSpec{Image: sent.Image},
			Command: []string{"true"}, Linux: &runtimeapi.LinuxContainerConfig{}}})
	if err == nil {
		rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.ContainerId})
		t.Fatalf("straight to %s, a create without user_specified_image succeeded: its success through the proxy shows nothing", testRig.Runtime.Name)
	}
	t.Logf("straight to %s, the same create without user_specified_image fails: %v", testRig.Runtime.Name, err)
}

// mustDial connects to a CRI endpoint for the rest of the test.
func mustDial(t *testing.T, ep string) *grpc.ClientConn {
	t.Helper()
	conn, err := rig.DialCRI(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
