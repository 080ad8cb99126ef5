package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// TestADaemonStartedWithTheRuntimeDownObservesTheNodeOnceItAnswers: the
// daemon starts while the runtime does not answer (node boot): the node
// is not observed (no image counts as preloaded), and once the runtime
// answers the daemon's next look observes it, without waiting for a GC
// run.
func TestADaemonStartedWithTheRuntimeDownObservesTheNodeOnceItAnswers(t *testing.T) {
	cfg := testConfig(t)
	// The runtime of testConfig stays, for Version; the images are on a
	// socket nobody listens on yet.
	imageSock := filepath.Join(filepath.Dir(cfg.Socket.Path), "images.sock")
	cfg.ImageEndpoint = "unix://" + imageSock
	addr := freeAddr(t)
	cfg.Monitoring.Address = addr
	cfg.EnsureSecretPulledImages.GCInterval.Duration = time.Hour // no GC run settles it
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, testOptions(cfg)) }()
	defer func() {
		cancel()
		<-done
	}()

	observed := func() (string, bool) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return "", false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "cri_image_proxy_ensure_node_observed ") {
				return line, true
			}
		}
		return "", false
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if ok() {
				return
			}
		}
		t.Fatalf("waited 30s for %s", what)
	}
	waitFor("the metrics", func() bool { _, ok := observed(); return ok })
	if line, _ := observed(); line != "cri_image_proxy_ensure_node_observed 0" {
		t.Fatalf("with the runtime's images away: %q, want 0", line)
	}

	fakecri.New("images").Serve(t, imageSock) // with no image
	waitFor("the node to be observed once the runtime answers", func() bool {
		line, _ := observed()
		return line == "cri_image_proxy_ensure_node_observed 1"
	})
}

// freeAddr is a 127.0.0.1 address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
