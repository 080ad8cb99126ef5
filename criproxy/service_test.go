package criproxy

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startSlowPull starts a PullImage the fake runtime takes a second to
// answer and returns once the runtime has it.
func startSlowPull(t *testing.T, rig *proxyRig) <-chan error {
	t.Helper()
	rig.runtime.BeforePull(aSecondLong)
	done := make(chan error, 1)
	before := rig.runtime.Calls("PullImage")
	go func() {
		_, err := rig.img.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "slow"}})
		done <- err
	}()
	for rig.runtime.Calls("PullImage") == before {
		time.Sleep(5 * time.Millisecond)
	}
	return done
}

func TestShutdown(t *testing.T) {
	t.Parallel()

	t.Run("a pull in flight finishes before the server stops, new calls are refused", func(t *testing.T) {
		rig := newProxyRig(t, Options{}, false)
		pull := startSlowPull(t, rig)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		rig.server.Shutdown(ctx)
		if err := <-pull; err != nil {
			t.Errorf("the pull in flight failed: %v", err)
		}
		if _, err := rig.rt.Version(context.Background(), &runtimeapi.VersionRequest{}); status.Code(err) != codes.Unavailable {
			t.Errorf("a call after shutdown: got %v, want Unavailable", err)
		}
	})

	t.Run("past the timeout the calls left are cancelled", func(t *testing.T) {
		rig := newProxyRig(t, Options{Interceptors: []Interceptor{Intercept(PullImage, onlyPull{}.PullImage)}}, false) // the typed path too
		pull := startSlowPull(t, rig)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		rig.server.Shutdown(ctx)
		if err := <-pull; err == nil {
			t.Errorf("the pull succeeded although the shutdown timed out")
		}
	})
}
