package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "bare-server" {
		if err := runBareServer(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bare-server:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	rounds      int
	seconds     float64
	only        string
	out         string
	proxy       string
	profile     string // scenario whose proxy CPU profile to capture
	pods        int    // pods per arm of the pod start benchmark; 0 skips it
	fleetNodes  int    // nodes of the fleet measurement; 0 skips it
	stormRounds int    // rounds per arm of the pod-start storm; 0 skips it
}

func run() error {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "rounds per scenario; each runs every arm once")
	flag.Float64Var(&o.seconds, "seconds", 1, "length of one arm's segment in a round")
	flag.StringVar(&o.only, "only", "", "run only the measurements whose name contains this (scenarios, \"go runtime\", \"fleet\", \"pod start\", \"storm\")")
	flag.StringVar(&o.out, "out", "_output/bench", "directory for the report (markdown)")
	flag.StringVar(&o.proxy, "proxy", "", "the cri-image-proxy binary (default: build it)")
	flag.StringVar(&o.profile, "profile", "", "capture the proxy's CPU profile during the scenario of this name, into the -out directory")
	flag.IntVar(&o.fleetNodes, "fleet-nodes", 100, "nodes of the fleet measurement (their API clients against the rig's apiserver); 0 skips it")
	flag.IntVar(&o.pods, "pod-starts", 50, "pods per arm of the pod start benchmark (a real kubelet on the proxy vs on containerd); 0 skips it")
	flag.IntVar(&o.stormRounds, "storm-rounds", 5, "rounds per arm of the pod-start storm (110 pods at once, a real kubelet on the proxy vs on containerd); 0 skips it")
	flag.Parse()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}

	chosen, parts, err := selectMeasurements(measurements(o), o.only)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if o.proxy == "" {
		o.proxy = filepath.Join(work, "cri-image-proxy")
		logf("building the proxy")
		if out, err := exec.Command("go", "build", "-o", o.proxy, "./cmd/cri-image-proxy").CombinedOutput(); err != nil {
			return fmt.Errorf("build: %v: %s", err, out)
		}
	}

	r, err := rig.Start(rig.Options{Logf: logf})
	if err != nil {
		return err
	}
	defer r.Stop()
	// The proxies run at the niceness the shipped unit gives the daemon:
	// what is measured is what a node runs.
	if r.ProxyNice, err = unitNice(shippedUnit); err != nil {
		return err
	}
	env := &benchEnv{rig: r, work: work, logf: logf, opts: o}
	defer env.close()
	if err := env.setUp(parts); err != nil {
		return err
	}

	rep := &report{}
	for _, m := range chosen {
		if err := m.run(env, rep); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	text := render(rep.results, rep.extra, env.describe()) + strings.Join(rep.sections, "")
	fmt.Println(text)
	if err := os.MkdirAll(o.out, 0o755); err == nil {
		path := filepath.Join(o.out, "bench-"+time.Now().Format("20060102-150405")+".md")
		if err := os.WriteFile(path, []byte(text), 0o644); err == nil {
			logf("report written to %s", path)
		}
	}
	if missed := failedTargets(rep.results, rep.extra); len(missed) > 0 {
		return fmt.Errorf("targets missed:\n  %s", strings.Join(missed, "\n  "))
	}
	return nil
}

// benchEnv is the set of processes and clients the scenarios use.
type benchEnv struct {
	rig  *rig.Rig
	work string
	logf func(string, ...any)
	opts options

	proxy *rig.Proc
	bare  *exec.Cmd
	pids  map[string]int // watched processes; "bench" is this one

	direct, proxied, bare1 *grpc.ClientConn
	presentImage           string
	monitors               map[string]string // proxies' monitoring addresses by name, when profiling
	inject                 *injectEnv
	ensure                 *ensureEnv
	policy                 *policyEnv
	token                  *tokenEnv
	far                    *farEnv
	extraProxies           []*rig.Proc
}

// setUp starts the base (containerd's present image and 1000 more, the
// pass-through proxy, the bare server), then the parts.
func (e *benchEnv) setUp(parts []part) error {
	// A present image for ImageStatus.
	e.presentImage = e.rig.Registry + "/" + rig.TeamAImage
	if res := e.rig.Crictl(context.Background(), "unix://"+e.rig.RuntimeSock, "pull", "--creds", "user:"+rig.Users["user"], e.presentImage); res.Err != nil {
		return fmt.Errorf("pull %s: %v: %s", e.presentImage, res.Err, res.Stderr)
	}
	e.logf("importing 1000 images into containerd")
	if err := importImages(e.work, e.rig.ContainerdSock, 1000); err != nil {
		return err
	}

	sock := filepath.Join(e.rig.Dir, "bench-proxy.sock")
	var err error
	args := []string{"--log-level", "info"}
	if e.proxy, err = e.rig.StartProxy(e.opts.proxy, sock, append(args, e.profiled("proxy")...)...); err != nil {
		return err
	}
	if e.direct, err = rig.DialCRI("unix://" + e.rig.RuntimeSock); err != nil {
		return err
	}
	if e.proxied, err = rig.DialCRI("unix://" + sock); err != nil {
		return err
	}

	// The bare server answers what containerd answered.
	ctx := context.Background()
	v, err := runtimeapi.NewRuntimeServiceClient(e.direct).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return err
	}
	st, err := runtimeapi.NewImageServiceClient(e.direct).ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: e.presentImage}})
	if err != nil || st.Image == nil {
		return fmt.Errorf("ImageStatus %s: %v (present: %v)", e.presentImage, err, st.GetImage() != nil)
	}
	var files []string
	for i, m := range []proto.Message{v, st} {
		b, _ := proto.Marshal(m)
		f := filepath.Join(e.work, fmt.Sprintf("resp%d.pb", i))
		if err := os.WriteFile(f, b, 0o644); err != nil {
			return err
		}
		files = append(files, f)
	}
	bareSock := filepath.Join(e.work, "bare.sock")
	e.bare = exec.Command(os.Args[0], append([]string{"bare-server", bareSock}, files...)...)
	e.bare.Stderr = os.Stderr
	if err := e.bare.Start(); err != nil {
		return err
	}
	if e.bare1, err = rig.DialCRI("unix://" + bareSock); err != nil {
		return err
	}
	for i := 0; ; i++ {
		if _, err := runtimeapi.NewRuntimeServiceClient(e.bare1).Version(ctx, &runtimeapi.VersionRequest{}); err == nil {
			break
		} else if i > 100 {
			return fmt.Errorf("bare server: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.pids = map[string]int{
		"bench":      0,
		"proxy":      e.proxy.Pid(),
		"containerd": e.rig.RuntimeProc().Pid(),
		"bare":       e.bare.Process.Pid,
	}
	for _, p := range parts {
		if err := setUpPart[p](e); err != nil {
			return err
		}
	}
	return nil
}

func (e *benchEnv) close() {
	e.closePolicy()
	for _, c := range []*grpc.ClientConn{e.direct, e.proxied, e.bare1} {
		if c != nil {
			c.Close()
		}
	}
	if e.bare != nil && e.bare.Process != nil {
		e.bare.Process.Kill()
		e.bare.Wait()
	}
	for _, p := range append(e.extraProxies, e.proxy) {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if e.token != nil && e.token.kube != nil {
		e.token.kube.Stop()
	}
	if e.ensure != nil && e.ensure.relay != nil {
		e.ensure.relay.Close()
	}
	if e.far != nil {
		e.far.relay.Close()
	}
}

func (e *benchEnv) describe() string {
	host, _ := os.Hostname()
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("host %s, %s (CONTAINERD=%s), %d rounds of %.1fs per arm, the proxies at nice %d (%s), load average at the end: %s",
		host, e.rig.Runtime.Name, e.rig.Runtime.Line, e.opts.rounds, e.opts.seconds, e.rig.ProxyNice, shippedUnit, strings.TrimSpace(string(load)))
}

// shippedUnit is the daemon's systemd unit, from the repository's root.
const shippedUnit = "deploy/systemd/cri-image-proxy.service"

// unitNice returns the Nice= of the systemd unit at path (0 when it sets
// none).
func unitNice(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Nice="); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return 0, fmt.Errorf("%s: Nice=%q: %w", path, v, err)
			}
			return n, nil
		}
	}
	return 0, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// profiled returns, with -profile, the flags that give the proxy named
// (as the arms' cpu columns name it) a monitoring address serving pprof,
// noted for profileProxy; nothing without -profile.
func (e *benchEnv) profiled(name string) []string {
	if e.opts.profile == "" {
		return nil
	}
	addr, err := rig.FreeAddr()
	if err != nil {
		return nil
	}
	if e.monitors == nil {
		e.monitors = map[string]string{}
	}
	e.monitors[name] = addr
	return []string{"--monitoring-address", addr, "--profiling"}
}

// profileProxy fetches a CPU profile, covering the next d, of the proxy
// the scenario's proxied arms run on (the last arm's CPU column that names
// a profiled proxy) into path; the returned function waits for it.
func (e *benchEnv) profileProxy(sc scenario, path string, d time.Duration) func() {
	addr := ""
	for _, a := range sc.arms {
		for _, c := range a.cpu {
			if m, ok := e.monitors[c]; ok {
				addr = m
			}
		}
	}
	done := make(chan struct{})
	if addr == "" {
		e.logf("profile: no profiled proxy in %q", sc.name)
		close(done)
		return func() {}
	}
	go func() {
		defer close(done)
		e.fetchProfile(addr, path, d)
	}()
	return func() { <-done }
}

// fetchProfile writes the CPU profile, over the next d, of the proxy
// whose monitoring address is addr into path.
func (e *benchEnv) fetchProfile(addr, path string, d time.Duration) {
	e.fetchPprof(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds()+0.5)), path, "go tool pprof -top")
}

// fetchTrace fetches an execution trace of the proxy at addr, covering
// the next d, into path: where its goroutines waited, not only ran.
func (e *benchEnv) fetchTrace(addr, path string, d time.Duration) {
	e.fetchPprof(fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%d", addr, int(d.Seconds()+0.5)), path, "go tool trace")
}

func (e *benchEnv) fetchPprof(url, path, tool string) {
	resp, err := http.Get(url)
	if err != nil {
		e.logf("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		e.logf("profile: %v", err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err == nil {
		e.logf("profile of the proxy: %s %s", tool, path)
	}
}
