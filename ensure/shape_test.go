package ensure_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestMalformedRequestsAreInvalidArgument: a request without the parts
// the decision needs is the caller's mistake, answered InvalidArgument
// naming the missing field, with nothing forwarded; not "unavailable,
// retry", which blames the runtime.
func TestMalformedRequestsAreInvalidArgument(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	ctx := context.Background()
	forwarded := false
	for _, tc := range []struct {
		name  string
		req   *runtimeapi.CreateContainerRequest
		field string
	}{
		{"an empty CreateContainer", &runtimeapi.CreateContainerRequest{}, "config"},
		{"a CreateContainer with no image", &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{}}, "config.image"},
		{"a CreateContainer with an empty image", &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{}}}, "config.image.image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.guard.CreateContainer(ctx, tc.req, func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				forwarded = true
				return &runtimeapi.CreateContainerResponse{}, nil
			})
			if st := status.Convert(toStatus(err)); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.field) {
				t.Errorf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	for _, tc := range []struct {
		name string
		req  *runtimeapi.PullImageRequest
	}{
		{"an empty PullImage", &runtimeapi.PullImageRequest{}},
		{"a PullImage with an empty image", &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.guard.PullImage(ctx, tc.req, func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				forwarded = true
				return &runtimeapi.PullImageResponse{}, nil
			})
			if st := status.Convert(toStatus(err)); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "image.image") {
				t.Errorf("got %v, want InvalidArgument naming image.image", err)
			}
		})
	}
	if forwarded {
		t.Errorf("a malformed request was forwarded to the runtime")
	}
}

// FuzzInterceptedRequests: any bytes a socket client sends as an
// intercepted request, once decoded, are answered with a status, never a
// panic; a CreateContainer or PullImage without an image is InvalidArgument
// and never reaches the runtime.
func FuzzInterceptedRequests(f *testing.F) {
	for _, b := range [][]byte{nil, {0x0a, 0x00}, {0x12, 0x02, 0x12, 0x00}, {0x12, 0x05, 0x12, 0x03, 0x0a, 0x01, 'x'}} {
		f.Add(b, uint8(0))
		f.Add(b, uint8(1))
		f.Add(b, uint8(2))
	}
	f.Fuzz(func(t *testing.T, frame []byte, method uint8) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		ctx := context.Background()
		var err error
		forwarded := false
		switch method % 3 {
		case 0:
			req := &runtimeapi.CreateContainerRequest{}
			if proto.Unmarshal(frame, req) != nil {
				return
			}
			_, err = s.guard.CreateContainer(ctx, req, func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
				forwarded = true
				return &runtimeapi.CreateContainerResponse{}, nil
			})
			if req.GetConfig().GetImage().GetImage() == "" && (forwarded || status.Code(toStatus(err)) != codes.InvalidArgument) {
				t.Fatalf("a CreateContainer without an image: forwarded %v, %v", forwarded, err)
			}
		case 1:
			req := &runtimeapi.PullImageRequest{}
			if proto.Unmarshal(frame, req) != nil {
				return
			}
			_, err = s.guard.PullImage(ctx, req, func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				forwarded = true
				return s.node.PullImage(ctx, r)
			})
			if req.GetImage().GetImage() == "" && (forwarded || status.Code(toStatus(err)) != codes.InvalidArgument) {
				t.Fatalf("a PullImage without an image: forwarded %v, %v", forwarded, err)
			}
		default:
			req := &runtimeapi.ImageStatusRequest{}
			if proto.Unmarshal(frame, req) != nil {
				return
			}
			_, err = s.imageStatus(ctx, req)
		}
		if err != nil {
			if _, ok := status.FromError(toStatus(err)); !ok {
				t.Fatalf("an error with no status: %v", err)
			}
		}
	})
}
