package registry

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestARegistryRefusalTellsThePodLessThanTheOperator: the pod reads the
// image it named, the check's short reason and a code that says whether
// to retry; never the endpoint, the digests or the detail the operator's
// log has.
func TestARegistryRefusalTellsThePodLessThanTheOperator(t *testing.T) {
	t.Parallel()
	const (
		image   = "test/team-b/app:v1"
		aConfig = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		served  = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	)
	for _, tc := range []struct {
		name     string
		err      *Error
		wantCode codes.Code
		wantText string
	}{
		{
			name: "a forged config is a refusal, PermissionDenied, as every refusal: a retry fetches the same bytes",
			err: &Error{Kind: ErrForged, Endpoint: "https://test/v2", Reason: "the registry's bytes are not the image's config",
				Detail: fmt.Sprintf("registry test, repository team-b/app: GET team-b/app/blobs/%s: 42 bytes whose digest is %s, not the config %s", aConfig, served, aConfig)},
			wantCode: codes.PermissionDenied,
			wantText: "pulling " + image + ": the registry's bytes are not the image's config: permission denied",
		},
		{
			name:     "a forged layer is a refusal, PermissionDenied",
			err:      &Error{Kind: ErrForged, Endpoint: "https://test/v2", Reason: "the registry's bytes are not the image's layer", Detail: "the blob decompresses to " + served},
			wantCode: codes.PermissionDenied,
			wantText: "pulling " + image + ": the registry's bytes are not the image's layer: permission denied",
		},
		{
			name:     "a credential refused is PermissionDenied",
			err:      &Error{Kind: ErrDenied, Endpoint: "https://test/v2", Reason: "access denied", Detail: "GET team-b/app/manifests/v1: 403 DENIED"},
			wantCode: codes.PermissionDenied,
			wantText: "pulling " + image + ": access denied: permission denied",
		},
		{
			name:     "a registry that cannot be asked is Unavailable: retry",
			err:      &Error{Kind: ErrUnreachable, Endpoint: "https://test/v2", Reason: "registry error", Detail: "GET team-b/app/manifests/v1: 503"},
			wantCode: codes.Unavailable,
			wantText: "pulling " + image + ": registry error: unavailable",
		},
		{
			name:     "an answer that is not the image is Aborted: retry",
			err:      &Error{Kind: ErrMoved, Endpoint: "https://test/v2", Reason: "the reference resolves to another image", Detail: "resolves to image " + served},
			wantCode: codes.Aborted,
			wantText: "pulling " + image + ": the reference resolves to another image: aborted",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := status.FromError(errgrpc.ToGRPC(Refusal(image, fmt.Errorf("ensure: %w", tc.err))))
			if st.Code() != tc.wantCode || st.Message() != tc.wantText {
				t.Errorf("the pod reads %s %q, want %s %q", st.Code(), st.Message(), tc.wantCode, tc.wantText)
			}
			for _, operatorOnly := range []string{"sha256:", tc.err.Endpoint, tc.err.Detail} {
				if strings.Contains(st.Message(), operatorOnly) {
					t.Errorf("the pod reads %q, which holds the operator's %q", st.Message(), operatorOnly)
				}
			}
		})
	}
}
