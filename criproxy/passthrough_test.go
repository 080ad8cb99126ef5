package criproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

func TestPassThroughUnary(t *testing.T) {
	t.Parallel()
	rig := newProxyRig(t, Options{}, false)
	rig.runtime.Fail("Status", notToday())
	rig.runtime.Put(fakecri.Image("sha256:runtime", "busybox"))
	ctx := context.Background()

	t.Run("a unary call returns the runtime's response unchanged", func(t *testing.T) {
		got, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		want := &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "runtime", RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("Version (-want +got):\n%s", diff)
		}
	})

	t.Run("a runtime error keeps its code, message and details", func(t *testing.T) {
		_, err := rig.rt.Status(ctx, &runtimeapi.StatusRequest{})
		st := status.Convert(err)
		if st.Code() != codes.FailedPrecondition || st.Message() != "runtime says: not today" {
			t.Fatalf("got %v, want FailedPrecondition with the runtime's message", err)
		}
		if d := st.Details(); len(d) != 1 || d[0].(*runtimeapi.VersionResponse).GetRuntimeName() != "detail" {
			t.Errorf("details = %v, want the runtime's one detail", d)
		}
	})

	t.Run("metadata reaches the runtime and its headers and trailers come back", func(t *testing.T) {
		var header, trailer metadata.MD
		ctx := metadata.AppendToOutgoingContext(ctx, "x-test", "hello")
		if _, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{}, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			t.Fatal(err)
		}
		if got := header.Get("x-seen-test"); len(got) != 1 || got[0] != "[hello]" {
			t.Errorf("runtime saw x-test = %v, want [hello]", got)
		}
		if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "from-runtime" {
			t.Errorf("trailer x-trailer = %v, want from-runtime", got)
		}
	})

	t.Run("on an error the client gets the same metadata as from the runtime itself", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(ctx, "x-test", "on-error")
		call := func(c runtimeapi.RuntimeServiceClient) (header, trailer metadata.MD) {
			_, err := c.Status(ctx, &runtimeapi.StatusRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("got %v, want FailedPrecondition", err)
			}
			return header, trailer
		}
		dh, dt := call(rig.direct)
		ph, pt := call(rig.rt)
		if diff := cmp.Diff(dh, ph); diff != "" {
			t.Errorf("header (-direct +proxied):\n%s", diff)
		}
		if diff := cmp.Diff(dt, pt); diff != "" {
			t.Errorf("trailer (-direct +proxied):\n%s", diff)
		}
		if got := ph.Get("x-seen-test"); len(got) != 1 || got[0] != "[on-error]" {
			t.Errorf("runtime saw x-test = %v, want [on-error]", got)
		}
	})

	t.Run("the client's deadline reaches the runtime", func(t *testing.T) {
		var header metadata.MD
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if _, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{}, grpc.Header(&header)); err != nil {
			t.Fatal(err)
		}
		ms, err := strconv.ParseInt(strings.Join(header.Get("x-seen-deadline-ms"), ""), 10, 64)
		if err != nil || ms <= 0 || ms > time.Hour.Milliseconds() {
			t.Errorf("runtime saw deadline in %q ms, want one within the hour", header.Get("x-seen-deadline-ms"))
		}
	})

	t.Run("a call past its deadline ends with DeadlineExceeded", func(t *testing.T) {
		rig.runtime.BeforePull(aSecondLong)
		defer rig.runtime.BeforePull(nil)
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "slow"}})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("got %v, want DeadlineExceeded", err)
		}
	})

	t.Run("a method the runtime does not implement returns its Unimplemented", func(t *testing.T) {
		_, err := rig.rt.Attach(ctx, &runtimeapi.AttachRequest{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("got %v, want Unimplemented", err)
		}
	})

	t.Run("an image call is not decoded when no hook wants it", func(t *testing.T) {
		got, err := rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}})
		if err != nil || got.GetImage().GetId() != "sha256:runtime" {
			t.Fatalf("ImageStatus = %v, %v", got, err)
		}
		// Only PullImage is typed: the proxy's own secret scrub is on it.
		var typed []string
		for _, sd := range rig.server.typedServices() {
			for _, m := range sd.Methods {
				typed = append(typed, m.MethodName)
			}
		}
		if len(typed) != 1 || typed[0] != "PullImage" {
			t.Errorf("a server without hooks registered typed methods %v, want PullImage (the secret scrub) alone", typed)
		}
	})
}

func TestPassThroughMessageSizes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		images   int // of about 1 KiB each
		wantCode codes.Code
	}{
		{name: "a 15 MiB response passes", images: 15 * 1024, wantCode: codes.OK},
		{name: "a 17 MiB response is refused as the kubelet would refuse it", images: 17 * 1024, wantCode: codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rig := newProxyRig(t, Options{}, false)
			pad := string(make([]byte, 1000))
			for i := range tc.images {
				rig.runtime.Put(fakecri.Image(fmt.Sprintf("sha256:%d", i), pad))
			}
			resp, err := rig.img.ListImages(context.Background(), &runtimeapi.ListImagesRequest{})
			if status.Code(err) != tc.wantCode {
				t.Fatalf("got %v, want %v", err, tc.wantCode)
			}
			if err == nil && len(resp.Images) != tc.images {
				t.Errorf("got %d images, want %d", len(resp.Images), tc.images)
			}
		})
	}
	t.Run("a 15 MiB request passes", func(t *testing.T) {
		rig := newProxyRig(t, Options{}, false)
		big := strings.Repeat("x", 15<<20)
		// The runtime answers with the name as a tag: 15 MiB back as well.
		rig.runtime.Put(fakecri.Image("sha256:big", big))
		resp, err := rig.img.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: big}})
		if err != nil {
			t.Fatal(err)
		}
		if tags := resp.GetImage().GetRepoTags(); len(tags) != 1 || tags[0] != big {
			t.Errorf("the answer did not carry the 15 MiB name back")
		}
	})
}

func TestPassThroughStreams(t *testing.T) {
	t.Parallel()
	rig := newProxyRig(t, Options{}, false)

	t.Run("a server stream delivers every message, the headers and the final status", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-test", "stream")
		stream, err := rig.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for {
			ev, err := stream.Recv()
			if err != nil {
				if status.Code(err) != codes.Aborted || status.Convert(err).Message() != "events end here" {
					t.Errorf("stream ended with %v, want the runtime's Aborted", err)
				}
				break
			}
			ids = append(ids, ev.ContainerId)
		}
		if diff := cmp.Diff([]string{"c0", "c1", "c2"}, ids); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
		hdr, _ := stream.Header()
		if got := hdr.Get("x-seen-test"); len(got) != 1 || got[0] != "[stream]" {
			t.Errorf("runtime saw x-test = %v, want [stream]", got)
		}
		if got := stream.Trailer().Get("x-trailer"); len(got) != 1 {
			t.Errorf("trailer missing: %v", stream.Trailer())
		}
	})

	t.Run("a unary method this build does not know is forwarded", func(t *testing.T) {
		in := wrapperspb.String("from a newer kubelet")
		out := new(wrapperspb.StringValue)
		if err := rig.conn.Invoke(context.Background(), "/runtime.v1.RuntimeService/MethodFromTheFuture", in, out); err != nil {
			t.Fatal(err)
		}
		if out.Value != in.Value {
			t.Errorf("got %q, want the echo %q", out.Value, in.Value)
		}
		if rig.runtime.Calls("/runtime.v1.RuntimeService/MethodFromTheFuture") != 1 {
			t.Errorf("the runtime did not see the call")
		}
	})

	t.Run("a bidirectional stream of an unknown service is forwarded both ways", func(t *testing.T) {
		desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
		cs, err := rig.conn.NewStream(context.Background(), desc, "/future.v9.Thing/Chat")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			msg := wrapperspb.String(strconv.Itoa(i))
			if err := cs.SendMsg(msg); err != nil {
				t.Fatal(err)
			}
			got := new(wrapperspb.StringValue)
			if err := cs.RecvMsg(got); err != nil {
				t.Fatal(err)
			}
			if got.Value != msg.Value {
				t.Fatalf("message %d: got %q", i, got.Value)
			}
		}
		if err := cs.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
			t.Errorf("after CloseSend: got %v, want EOF", err)
		}
	})

	t.Run("cancelling a stream cancels it at the runtime", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
		cs, err := rig.conn.NewStream(ctx, desc, "/future.v9.Thing/Chat")
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(wrapperspb.String("x")); err != nil {
			t.Fatal(err)
		}
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := cs.RecvMsg(new(wrapperspb.StringValue)); status.Code(err) != codes.Canceled {
			t.Errorf("got %v, want Canceled", err)
		}
	})
}

func TestSeparateImageEndpoint(t *testing.T) {
	t.Parallel()
	rig := newProxyRig(t, Options{}, true)
	// Each holds x, under an ID of its name: the answer says which one gave it.
	rig.runtime.Put(fakecri.Image("sha256:runtime", "x"))
	rig.image.Put(fakecri.Image("sha256:image", "x"))
	ctx := context.Background()

	v, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != "runtime" {
		t.Errorf("Version went to %q (%v), want the runtime endpoint", v.GetRuntimeName(), err)
	}
	st, err := rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
	if err != nil || st.GetImage().GetId() != "sha256:image" {
		t.Errorf("ImageStatus answered %v (%v), want the image endpoint", st, err)
	}
	if rig.runtime.Calls("ImageStatus") != 0 {
		t.Errorf("the runtime endpoint served an ImageService call")
	}
}
