package fakecri_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/wrapperspb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// client serves r on a socket and returns a connection to it.
func client(t *testing.T, r *fakecri.Runtime) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(fakecri.SocketDir(t), "rt.sock")
	r.Serve(t, sock)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestTheImagesAreTheOnesPutAndPulled(t *testing.T) {
	t.Parallel()
	app := fakecri.Image("sha256:app", "app:v1")
	app.RepoDigests = []string{"app@sha256:m"}
	r := fakecri.New("rt", app)
	img := runtimeapi.NewImageServiceClient(client(t, r))
	ctx := context.Background()
	statusOf := func(name string) *runtimeapi.Image {
		t.Helper()
		resp, err := img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetImage()
	}
	pull := func(name string) string {
		t.Helper()
		resp, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetImageRef()
	}
	ids := func() (ids []string) {
		t.Helper()
		resp, err := img.ListImages(ctx, &runtimeapi.ListImagesRequest{Filter: &runtimeapi.ImageFilter{Image: &runtimeapi.ImageSpec{Image: "ignored"}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range resp.Images {
			ids = append(ids, i.Id)
		}
		return ids
	}

	for _, name := range []string{"sha256:app", "app:v1", "app@sha256:m"} {
		if diff := cmp.Diff(app, statusOf(name), protocmp.Transform()); diff != "" {
			t.Errorf("ImageStatus %s (-want +got):\n%s", name, diff)
		}
	}
	for _, name := range []string{"app", "docker.io/library/app:v1", "sha256:ap"} {
		if got := statusOf(name); got != nil {
			t.Errorf("ImageStatus %s, a name written otherwise: %v, want none", name, got)
		}
	}
	if got := pull("app:v1"); got != "sha256:app" {
		t.Errorf("a pull of a name held answers %s, want its ID", got)
	}
	if got := pull("other:v2"); got != "sha256:pulled-other:v2" || statusOf("other:v2").GetId() != got {
		t.Errorf("a pull of a new name answers %s and holds %v", got, statusOf("other:v2"))
	}
	if diff := cmp.Diff([]string{"sha256:app", "sha256:pulled-other:v2"}, ids()); diff != "" {
		t.Errorf("ListImages (-want +got):\n%s", diff)
	}
	for _, name := range []string{"app:v1", "app:v1"} { // the second: already gone, and no error
		if _, err := img.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: name}}); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"sha256:pulled-other:v2"}, ids()); diff != "" {
		t.Errorf("ListImages after a removal (-want +got):\n%s", diff)
	}
}

func TestEveryCallIsCountedReportedAndMayBeMadeToFail(t *testing.T) {
	t.Parallel()
	r := fakecri.New("rt")
	conn := client(t, r)
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-test", "hello")
	busy := status.Error(codes.Unavailable, "busy")

	for _, tc := range []struct {
		name     string
		fail     error
		wantName string
	}{
		{"it answers", nil, "rt"},
		{"a failure set is the answer, after the report", busy, ""},
		{"a failure removed, it answers again", nil, "rt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.Fail("Version", tc.fail)
			before := r.Calls("Version")
			var header, trailer metadata.MD
			v, err := rt.Version(ctx, &runtimeapi.VersionRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
			if status.Code(err) != status.Code(tc.fail) || v.GetRuntimeName() != tc.wantName {
				t.Errorf("Version = %v, %v; want %q, %v", v, err, tc.wantName, tc.fail)
			}
			if got := r.Calls("/runtime.v1.RuntimeService/Version") - before; got != 1 {
				t.Errorf("counted %d calls, want 1", got)
			}
			if got := header.Get("x-seen-test"); len(got) != 1 || got[0] != "[hello]" {
				t.Errorf("x-seen-test = %v, want [hello]", got)
			}
			if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "from-runtime" {
				t.Errorf("x-trailer = %v, want from-runtime", got)
			}
		})
	}
	if diff := cmp.Diff([]string{"application/grpc"}, r.ContentTypes("Version")); diff != "" {
		t.Errorf("content-types (-want +got):\n%s", diff)
	}

	t.Run("a hook before each pull answers in its place when it fails", func(t *testing.T) {
		r.BeforePull(func(_ context.Context, req *runtimeapi.PullImageRequest) error {
			if req.GetImage().GetImage() == "refused" {
				return busy
			}
			return nil
		})
		defer r.BeforePull(nil)
		img := runtimeapi.NewImageServiceClient(conn)
		for image, want := range map[string]codes.Code{"refused": codes.Unavailable, "app": codes.OK} {
			if _, err := img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}); status.Code(err) != want {
				t.Errorf("PullImage %s: %v, want %v", image, err, want)
			}
		}
	})
}

func TestAMethodItDoesNotKnowIsEchoed(t *testing.T) {
	t.Parallel()
	r := fakecri.New("rt")
	conn := client(t, r)
	const method = "/future.v9.Thing/Chat"
	in, out := wrapperspb.String("from a newer kubelet"), new(wrapperspb.StringValue)
	if err := conn.Invoke(context.Background(), method, in, out); err != nil || out.Value != in.Value {
		t.Fatalf("got %q (%v), want the echo %q", out.Value, err, in.Value)
	}
	if r.Calls(method) != 1 {
		t.Errorf("counted %d calls of %s, want 1", r.Calls(method), method)
	}
	if _, err := runtimeapi.NewRuntimeServiceClient(conn).Attach(context.Background(), &runtimeapi.AttachRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("a CRI method it does not answer: %v, want Unimplemented", err)
	}
}
