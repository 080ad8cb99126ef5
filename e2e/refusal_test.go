package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// registryRefusal is what the runtime itself says, asked directly, when
// the registry refuses a pull of image with auth (nil: anonymous). Tests
// look for it in the proxied answer instead of one runtime version's
// wording: containerd 1.6 says "401 Unauthorized", 2.x "authorization
// failed: no basic auth credentials".
func registryRefusal(t *testing.T, image string, auth *runtimeapi.AuthConfig) string {
	t.Helper()
	conn, err := dialCRI(direct())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = runtimeapi.NewImageServiceClient(conn).PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth})
	if err == nil {
		t.Fatalf("a direct pull of %s was not refused: the test's premise is wrong", image)
	}
	return registryPart(status.Convert(err).Message())
}

// registryPart keeps the tail of a pull error that says why the registry
// refused: the part after the runtime's "failed to resolve ..." framing,
// which the proxy may re-frame when it tried several credentials.
func registryPart(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return msg[i+2:]
	}
	return msg
}

// crictlMessage is crictl's fatal message with logrus' quoting undone, so
// that it can be searched for what the runtime said.
func crictlMessage(stderr string) string {
	m := fatalMessage(stderr)
	if u, err := strconv.Unquote(`"` + m + `"`); err == nil {
		return u
	}
	return m
}
