package criproxy

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI-O hands a connection to its gRPC server only when the first request
// says content-type application/grpc, exactly (it serves HTTP on the same
// socket): every call the proxy makes must say what the kubelet's say.
func TestCallsReachTheRuntimeAsTheKubeletsDo(t *testing.T) {
	t.Parallel()
	rig := newProxyRig(t, Options{}, false)
	ctx := context.Background()
	contentType := func(call func(h *metadata.MD) error) string {
		t.Helper()
		var h metadata.MD
		if err := call(&h); err != nil {
			t.Fatal(err)
		}
		return h.Get("x-seen-content-type")[0]
	}
	want := contentType(func(h *metadata.MD) error {
		_, err := rig.direct.Version(ctx, &runtimeapi.VersionRequest{}, grpc.Header(h))
		return err
	})
	if want != "[application/grpc]" {
		t.Fatalf("a plain gRPC client says %s: the test's premise is wrong", want)
	}
	for name, call := range map[string]func(h *metadata.MD) error{
		"a passed-through unary call": func(h *metadata.MD) error {
			_, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{}, grpc.Header(h))
			return err
		},
		"an intercepted call": func(h *metadata.MD) error {
			_, err := rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "x"}}, grpc.Header(h))
			return err
		},
		"a method this build does not know (a stream)": func(h *metadata.MD) error {
			cs, err := rig.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/runtime.v1.RuntimeService/NotYetInvented")
			if err != nil {
				return err
			}
			if err := cs.SendMsg(&runtimeapi.VersionRequest{}); err != nil {
				return err
			}
			got, err := cs.Header()
			*h = got
			cs.CloseSend()
			return err
		},
	} {
		if got := contentType(call); got != want {
			t.Errorf("%s reaches the runtime as %s, want %s", name, got, want)
		}
	}
}
