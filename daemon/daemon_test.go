package daemon

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// testConfig is a configuration with ensure on, every path in a new
// directory, and a fake runtime behind it.
func testConfig(t *testing.T) *config.ProxyConfiguration {
	t.Helper()
	dir := fakecri.SocketDir(t)
	runtimeSock := filepath.Join(dir, "runtime.sock")
	fakecri.New("fake").Serve(t, runtimeSock)

	cfg := config.Default()
	cfg.Socket.Path = filepath.Join(dir, "proxy.sock")
	cfg.RuntimeEndpoint = "unix://" + runtimeSock
	cfg.Monitoring.Address = "-"
	cfg.ShutdownTimeout.Duration = 5 * time.Second
	e := &cfg.EnsureSecretPulledImages
	e.Enabled = true
	e.DatabasePath = filepath.Join(dir, "ensure.db")
	e.AdminSocket = filepath.Join(dir, "admin.sock")
	return cfg
}

func testOptions(cfg *config.ProxyConfiguration) Options {
	return Options{
		Reload:    func() (*config.ProxyConfiguration, error) { return cfg, nil },
		Version:   "test",
		BuildInfo: prometheus.NewGauge(prometheus.GaugeOpts{Name: "build_info"}),
	}
}

// assertReleased fails unless the daemon let go of everything it opened:
// its sockets are gone and can be listened on again, and the records
// database opens.
func assertReleased(t *testing.T, cfg *config.ProxyConfiguration) {
	t.Helper()
	for _, path := range []string{cfg.Socket.Path, cfg.EnsureSecretPulledImages.AdminSocket} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("the socket %s is still there (%v)", path, err)
		}
		l, err := unixsock.Listen(path, unixsock.Options{})
		if err != nil {
			t.Errorf("the socket %s is still held: %v", path, err)
			continue
		}
		l.Close()
	}
	s, err := records.Open(cfg.EnsureSecretPulledImages.DatabasePath, records.Options{})
	if err != nil {
		t.Errorf("the records database is still held: %v", err)
		return
	}
	s.Close()
}

func TestRunServesUntilCancelledThenReleasesEverything(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, testOptions(cfg)) }()

	conn, err := grpc.NewClient("unix://"+cfg.Socket.Path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var v *runtimeapi.VersionResponse
	for i := 0; i < 100; i++ { // until the daemon serves, at most about 10s
		cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
		v, err = runtimeapi.NewRuntimeServiceClient(conn).Version(cctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true))
		ccancel()
		if err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned before serving: %v", err)
		default:
		}
	}
	if err != nil || v.GetRuntimeName() != "fake" {
		t.Fatalf("Version through the proxy: %v, %v", v, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	assertReleased(t, cfg)
}

func TestRunThatCannotStartReleasesWhatItOpened(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name  string
		setup func(*config.ProxyConfiguration)
		want  string
	}{
		{"the monitoring address is in use, after the sockets were opened",
			func(c *config.ProxyConfiguration) { c.Monitoring.Address = taken.Addr().String() }, "monitoring address"},
		{"the CRI socket's path is not a socket, after the admin socket was opened",
			func(c *config.ProxyConfiguration) { os.WriteFile(c.Socket.Path, []byte("x"), 0o600) }, "not a socket"},
		{"the image policy configuration does not load",
			func(c *config.ProxyConfiguration) {
				c.ImagePolicy = &config.ImagePolicy{Config: filepath.Join(filepath.Dir(c.Socket.Path), "absent.yaml"), BinDir: "/nonexistent"}
			}, "image policy config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.setup(cfg)
			err := Run(context.Background(), cfg, testOptions(cfg))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error about %q", err, tc.want)
			}
			os.Remove(cfg.Socket.Path) // the regular file the second case put there
			assertReleased(t, cfg)
		})
	}
}

// TestOneRegistryCheckForEnsureAndImagePolicy: the daemon builds the
// registry check when ensure or the image policy is on, once (its metrics
// are registered once: a second checker on the same registry would fail
// to start), and none when neither is.
func TestOneRegistryCheckForEnsureAndImagePolicy(t *testing.T) {
	bin, file, write := imagePolicyFiles(t)
	write("secure")
	for _, tc := range []struct {
		name           string
		ensure, policy bool
	}{
		{"ensure alone", true, false},
		{"the image policy alone", false, true},
		{"both", true, true},
		{"neither", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.EnsureSecretPulledImages.Enabled = tc.ensure
			if tc.policy {
				cfg.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
				cfg.SetDefaults()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			d := &daemon{cfg: cfg, opts: testOptions(cfg), log: slog.New(slog.DiscardHandler), reg: prometheus.NewRegistry()}
			defer d.closeAll()
			if err := d.assemble(ctx); err != nil {
				t.Fatal(err)
			}
			if (d.registry != nil) != (tc.ensure || tc.policy) {
				t.Errorf("registry check %v, want one: %v", d.registry, tc.ensure || tc.policy)
			}
		})
	}
}
