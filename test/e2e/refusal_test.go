package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// registryRefusal checks the premise that the registry refuses a pull of
// image with auth (nil: anonymous), asked through the runtime directly, and
// returns what the proxied refusal must say: the image as the pod named it.
// The proxy's registry check refuses such a pull before the runtime is
// asked, in its own words; the runtime's own wording differs
// between versions anyway (containerd 1.6 says "401 Unauthorized", 2.x
// "authorization failed: no basic auth credentials").
func registryRefusal(t *testing.T, image string, auth *runtimeapi.AuthConfig) string {
	t.Helper()
	conn, err := rig.DialCRI(direct())
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
	return image
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
