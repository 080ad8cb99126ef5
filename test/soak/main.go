package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

type options struct {
	duration, interval, warmup time.Duration
	restartEvery, reloadEvery  time.Duration
	gcInterval, gracePeriod    time.Duration
	think                      time.Duration
	tolerance                  float64
	images, records, window    int
	out, proxy, plugin         string
	// adjusted notes what a short run changed of the flags.
	adjusted []string
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "how long the load runs (after the setup)")
	flag.DurationVar(&o.interval, "interval", time.Minute, "time between two samples")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Minute, "samples before this are not held to the flatness targets")
	flag.DurationVar(&o.restartEvery, "restart-every", 10*time.Minute, "stop and start the runtime this often")
	flag.DurationVar(&o.reloadEvery, "reload-every", 2*time.Minute, "send the proxy SIGHUP (a configuration reload) this often")
	flag.DurationVar(&o.gcInterval, "gc-interval", time.Minute, "the proxy's ensureSecretPulledImages.gcInterval")
	flag.DurationVar(&o.gracePeriod, "grace-period", 2*time.Minute, "the proxy's ensureSecretPulledImages.gracePeriod")
	flag.DurationVar(&o.think, "think", 200*time.Millisecond, "pause between two steps of a tenant")
	flag.Float64Var(&o.tolerance, "tolerance", 0.05, "largest drift of a series after the warm-up, as a fraction of its mean")
	flag.IntVar(&o.images, "images", 1000, "distinct images pushed and cycled through the node (split among 4 tenants)")
	flag.IntVar(&o.records, "records", 100000, "records the database is prefilled with")
	flag.IntVar(&o.window, "window", 30, "images a tenant keeps on the node; the oldest is removed past it")
	flag.StringVar(&o.out, "out", "_output/soak", "directory for the CSV, the plot, the summary and the proxy's log")
	flag.StringVar(&o.proxy, "proxy", "", "the cri-image-proxy binary (default: build it)")
	flag.StringVar(&o.plugin, "plugin", "", "the docker-config-credential-provider binary (default: build it)")
	flag.Parse()
	o.adjust()
	code, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

// adjust fits a short run (make soak SOAK=5m, for development): a third of
// it as the warm-up, at least 20 samples, one runtime restart half-way.
func (o *options) adjust() {
	if o.duration < 3*o.warmup {
		o.warmup = o.duration / 3
		o.adjusted = append(o.adjusted, fmt.Sprintf("warm-up %v (a third of the run)", o.warmup))
	}
	if o.duration/o.interval < 20 {
		o.interval = max(o.duration/20, 5*time.Second)
		o.adjusted = append(o.adjusted, fmt.Sprintf("sampled every %v (20 samples at least)", o.interval))
	}
	if o.duration < 2*o.restartEvery {
		o.restartEvery = o.duration / 2
		o.adjusted = append(o.adjusted, fmt.Sprintf("one runtime restart, at %v", o.restartEvery))
	}
	if o.images < 4 {
		o.images = 4
	}
}

var logMu sync.Mutex

func logf(format string, args ...any) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(os.Stderr, "[soak %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// env is the running soak: the rig, the proxy, its files and clients.
type env struct {
	o       options
	rig     *rig.Rig
	work    string // the soak's own directory, in the rig's
	proxy   *rig.Proc
	sock    string // the proxy's CRI socket
	metrics string // its monitoring address
	db      string
	admin   string
	plugins string // the credential provider configuration
	// proxied and direct are CRI connections to the proxy and to the
	// runtime (they reconnect across a runtime restart).
	proxied, direct *grpc.ClientConn
	ballast         []string // the prefilled records' image IDs

	runtimeMu sync.Mutex // held while the runtime restarts
	counters  counters
}

func run(o options) (int, error) {
	if os.Geteuid() != 0 {
		return 0, fmt.Errorf("the soak runs a private containerd: run it as root (make deps first)")
	}
	start := time.Now()
	if len(o.adjusted) > 0 {
		logf("a short run: %s", strings.Join(o.adjusted, "; "))
	}
	bin, err := os.MkdirTemp("", "soak-bin")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(bin)
	pluginDir := filepath.Join(bin, "plugins")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return 0, err
	}
	if o.proxy == "" {
		o.proxy = filepath.Join(bin, "cri-image-proxy")
		logf("building the proxy")
		if err := goBuild(o.proxy, "./cmd/cri-image-proxy"); err != nil {
			return 0, err
		}
	}
	pluginBin := filepath.Join(pluginDir, "docker-config-credential-provider")
	if o.plugin == "" {
		if err := goBuild(pluginBin, "./cmd/docker-config-credential-provider"); err != nil {
			return 0, err
		}
	} else if err := os.Symlink(o.plugin, pluginBin); err != nil {
		return 0, err
	}

	r, err := rig.Start(rig.Options{Logf: logf})
	if err != nil {
		return 0, err
	}
	e := &env{o: o, rig: r, work: filepath.Join(r.Dir, "soak")}
	defer func() {
		if e.proxied != nil {
			e.proxied.Close()
		}
		if e.direct != nil {
			e.direct.Close()
		}
		if e.proxy != nil {
			e.proxy.Stop(30 * time.Second)
		}
		logf("stopping the rig")
		if err := r.Stop(); err != nil {
			logf("stopping the rig: %v", err)
		}
	}()
	if err := os.MkdirAll(e.work, 0o755); err != nil {
		return 0, err
	}
	tenants, err := e.setUp(pluginDir)
	if err != nil {
		return 0, err
	}
	logf("setup took %v; the load runs for %v, a sample every %v", time.Since(start).Round(time.Second), o.duration, o.interval)
	res := e.soak(tenants)
	logf("the load ended; checking the targets")
	rep := e.check(tenants, res)
	if err := e.write(rep); err != nil {
		logf("writing the report: %v", err)
	}
	fmt.Println(rep.markdown)
	if len(rep.missed) > 0 {
		fmt.Fprintf(os.Stderr, "soak: %d target(s) missed:\n  %s\n", len(rep.missed), strings.Join(rep.missed, "\n  "))
		return 1, nil
	}
	logf("every target met; report in %s", o.out)
	return 0, nil
}

func goBuild(out, pkg string) error {
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v: %s", pkg, err, b)
	}
	return nil
}

// proxyPid is the pid of the proxy started at setup.
func (e *env) proxyPid() int { return e.proxy.Pid() }

// sighup asks the proxy to reload its configuration.
func (e *env) sighup() error { return e.proxy.Signal(syscall.SIGHUP) }
