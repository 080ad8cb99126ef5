package criproxy

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestNoCredentialInAnError: whatever the runtime quotes of the request's
// credential (the auth field decoded and %q-quoted, a password, tokens)
// is cut out of the error the client gets; the code stays.
func TestNoCredentialInAnError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		auth    *runtimeapi.AuthConfig
		secrets []string
	}{
		{"an auth that decodes to no user:password, with a quote in it", &runtimeapi.AuthConfig{Auth: base64.StdEncoding.EncodeToString([]byte(`s3cr"et-no-colon`))}, []string{`s3cr"et-no-colon`, `s3cr\"et-no-colon`}},
		{"an auth of user:password", &runtimeapi.AuthConfig{Auth: base64.StdEncoding.EncodeToString([]byte("alice:hunter22"))}, []string{"hunter22"}},
		{"a password and tokens", &runtimeapi.AuthConfig{Username: "alice", Password: "pw-123456", IdentityToken: "idtok-abcdef", RegistryToken: "regtok-ghijk"}, []string{"pw-123456", "idtok-abcdef", "regtok-ghijk"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rig := newProxyRig(t, Options{}, false)
			rig.runtime.BeforePull(quoteAuth)
			_, err := rig.img.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "quote-auth"}, Auth: tc.auth})
			if status.Code(err) != codes.Unknown {
				t.Fatalf("code %v, want the runtime's Unknown: %v", status.Code(err), err)
			}
			for _, s := range tc.secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("the error quotes the credential %q: %v", s, err)
				}
			}
			if !strings.Contains(err.Error(), "quote-auth") || !strings.Contains(err.Error(), redacted) {
				t.Errorf("the error lost what it says besides the secret: %v", err)
			}
		})
	}
}

// quoteAuth fails a pull as containerd 1.6 does on an auth that decodes
// to no "user:password": quoting what it decoded, and the rest of the
// credential with it.
func quoteAuth(_ context.Context, r *runtimeapi.PullImageRequest) error {
	a := r.GetAuth()
	dec, _ := base64.StdEncoding.DecodeString(a.GetAuth())
	return status.Errorf(codes.Unknown, "failed to pull and unpack image %q: invalid decoded auth: %q; password %s; token %s/%s",
		r.GetImage().GetImage(), dec, a.GetPassword(), a.GetIdentityToken(), a.GetRegistryToken())
}

func TestScrubError(t *testing.T) {
	t.Parallel()
	const secret = "hunter22"
	withMessageAndDetails := func(msg, detail string) error {
		st, err := status.New(codes.Unauthenticated, msg).WithDetails(&errdetails.ErrorInfo{Reason: detail})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	withDetails := func(detail string) error { return withMessageAndDetails("denied", detail) }
	for _, tc := range []struct {
		name        string
		err         error
		code        codes.Code
		keepDetails bool
	}{
		{"a status keeps its code", status.Error(codes.NotFound, "no image, auth "+secret), codes.NotFound, false},
		{"an errdefs error keeps the code the edge gives it", fmt.Errorf("pull with %s: %w", secret, errdefs.ErrPermissionDenied), codes.PermissionDenied, false},
		{"a context error keeps the code the edge gives it", fmt.Errorf("pull with %s: %w", secret, context.DeadlineExceeded), codes.DeadlineExceeded, false},
		{"details that quote a secret go", withDetails("auth " + secret), codes.Unauthenticated, false},
		{"details that quote no secret stay", withDetails("no credential here"), codes.Unauthenticated, true},
		{"details that quote no secret stay when the message is scrubbed", withMessageAndDetails("denied for "+secret, "no credential here"), codes.Unauthenticated, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := ScrubError(tc.err, secret)
			st := status.Convert(got)
			if st.Code() != tc.code {
				t.Errorf("code %v, want %v", st.Code(), tc.code)
			}
			if strings.Contains(st.Message(), secret) || strings.Contains(fmt.Sprint(st.Details()), secret) {
				t.Errorf("the secret is still there: %v %v", st.Message(), st.Details())
			}
			if (len(st.Details()) > 0) != tc.keepDetails {
				t.Errorf("details %v, want kept: %v", st.Details(), tc.keepDetails)
			}
		})
	}
}

// rawCodec sends a frame as it is, to hand the proxy what no client
// library would encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

var _ encoding.Codec = rawCodec{}

// TestAnUndecodableRequestIsInvalidArgumentOnEveryInterceptedMethod:
// invalid UTF-8 in a string field gets one code, InvalidArgument, whether
// the method is intercepted with a filter (ImageStatus) or without one
// (PullImage, CreateContainer).
func TestAnUndecodableRequestIsInvalidArgumentOnEveryInterceptedMethod(t *testing.T) {
	t.Parallel()
	h := &picky{}
	var log []string
	rig := newProxyRig(t, Options{Interceptors: []Interceptor{
		InterceptFiltered(ImageStatus, h.ImageStatus, h.WantsImageStatus),
		Intercept(CreateContainer, (&recorder{name: "r", log: &log}).CreateContainer),
	}}, false)
	conn, err := grpc.NewClient("unix://"+rig.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Field 1 (a message) holding field 1 (a string) of one byte 0xff.
	badImageSpec := []byte{0x0a, 0x03, 0x0a, 0x01, 0xff}
	// CreateContainer: field 2 (config) holding field 2 (image spec).
	badCreate := []byte{0x12, 0x05, 0x12, 0x03, 0x0a, 0x01, 0xff}
	for _, tc := range []struct {
		method string
		frame  []byte
	}{
		{"/runtime.v1.ImageService/ImageStatus", badImageSpec},
		{"/runtime.v1.ImageService/PullImage", badImageSpec},
		{"/runtime.v1.RuntimeService/CreateContainer", badCreate},
	} {
		var out []byte
		err := conn.Invoke(context.Background(), tc.method, &tc.frame, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s with invalid UTF-8: %v, want InvalidArgument", tc.method, err)
		}
	}
}
