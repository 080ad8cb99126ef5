package rig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Users of the authenticated registry. "user" pushed the images; every
// user may pull everything (htpasswd has no per-repository rules), so the
// tenants differ only by their credentials.
var Users = map[string]string{
	"user":  "pass",
	"alice": "alice-secret",
	"bob":   "bob-secret",
}

// Options configure a rig. The zero value is the usual rig.
type Options struct {
	// BaseDir holds the rigs' directories. Default /tmp/cri-image-proxy-rig
	// (short, for unix socket paths).
	BaseDir string
	// ToolsDir holds crictl and critest from hack/install-deps.sh. Default
	// $TOOLS_DIR, else /var/cache/cri-image-proxy/tools.
	ToolsDir string
	// GCRAuthed mirrors gcr.io to the authenticated registry instead of the
	// anonymous one, so critest's images need credentials.
	GCRAuthed bool
	// Runtime is the containerd to run; the zero value is RuntimeFromEnv.
	Runtime Runtime
	// RegistryUsers makes the authenticated registry log at debug level,
	// the only level at which it names the user of a request it answered
	// (RegistryUsers). Off, as for the bench, which measures the registry
	// too.
	RegistryUsers bool
	// Logf reports progress; nil is quiet.
	Logf func(format string, args ...any)
}

// Rig is a running set of real components.
type Rig struct {
	Dir            string // the rig's directory; logs are here
	ToolsDir       string
	ContainerdSock string // containerd's CRI socket (a path)
	Registry       string // authenticated registry, 127.0.0.1:port
	AnonRegistry   string // the same storage without authentication
	Snapshotter    string
	Runtime        Runtime

	opts       Options
	proxies    int // proxies started, to name their logs
	containerd *Proc
	registries []*Proc
}

// DefaultToolsDir is where hack/install-deps.sh puts crictl and critest.
func DefaultToolsDir() string {
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		return d
	}
	return "/var/cache/cri-image-proxy/tools"
}

// Start starts containerd and the registries and pushes the test images.
// On error, whatever was started is stopped again.
func Start(opts Options) (r *Rig, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the rig needs root (containerd, mounts)")
	}
	if opts.BaseDir == "" {
		opts.BaseDir = "/tmp/cri-image-proxy-rig"
	}
	if opts.ToolsDir == "" {
		opts.ToolsDir = DefaultToolsDir()
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if err := requireCommands("docker-registry", "nsenter", "ip"); err != nil {
		return nil, err
	}
	if opts.Runtime.Name == "" {
		rt, err := RuntimeFromEnv(opts.ToolsDir)
		if err != nil {
			return nil, err
		}
		opts.Runtime = rt
	}
	// critest is checked where it runs: the demo installs crictl only.
	if _, err := os.Stat(filepath.Join(opts.ToolsDir, "crictl")); err != nil {
		return nil, fmt.Errorf("crictl not in %s: run hack/install-deps.sh (as root) first", opts.ToolsDir)
	}
	if err := os.MkdirAll(opts.BaseDir, 0o755); err != nil {
		return nil, err
	}
	reapStale(opts.BaseDir, opts.Logf)
	dir, err := os.MkdirTemp(opts.BaseDir, "r")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	r = &Rig{Dir: dir, ToolsDir: opts.ToolsDir, Runtime: opts.Runtime, opts: opts, ContainerdSock: filepath.Join(dir, "containerd", "containerd.sock")}
	defer func() {
		if err != nil {
			r.Stop()
			r = nil
		}
	}()

	// Registries first: containerd's mirrors point at them.
	regPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	anonPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	r.Registry, r.AnonRegistry = fmt.Sprintf("127.0.0.1:%d", regPort), fmt.Sprintf("127.0.0.1:%d", anonPort)
	regDir := filepath.Join(dir, "registry")
	if err := os.MkdirAll(filepath.Join(regDir, "data"), 0o755); err != nil {
		return nil, err
	}
	htpasswd := filepath.Join(regDir, "htpasswd")
	if err := writeHtpasswd(htpasswd, Users); err != nil {
		return nil, err
	}
	opts.Logf("starting registries: %s (htpasswd) and %s (anonymous)", r.Registry, r.AnonRegistry)
	level := "info"
	if opts.RegistryUsers {
		level = "debug"
	}
	p, err := startRegistry(regDir, "registry", r.Registry, filepath.Join(regDir, "data"), htpasswd, level, 401)
	if err != nil {
		return nil, err
	}
	r.registries = append(r.registries, p)
	if p, err = startRegistry(regDir, "registry-anon", r.AnonRegistry, filepath.Join(regDir, "data"), "", "info", 200); err != nil {
		return nil, err
	}
	r.registries = append(r.registries, p)

	opts.Logf("pushing test images to %s", r.Registry)
	if err := pushImages(r.Registry, "user", Users["user"], opts.ToolsDir); err != nil {
		return nil, err
	}

	ctrDir := filepath.Join(dir, "containerd")
	certs := filepath.Join(ctrDir, "certs.d")
	gcrPort := anonPort
	if opts.GCRAuthed {
		gcrPort = regPort
	}
	for name, port := range map[string]int{
		r.Registry:          regPort,
		"registry.rig.test": regPort, // the authenticated registry under a DNS-like name
		"gcr.io":            gcrPort, // critest's images
		"registry.k8s.io":   anonPort,
	} {
		if err := writeHostsToml(certs, name, port); err != nil {
			return nil, err
		}
	}
	if err := writeCNI(filepath.Join(ctrDir, "cni")); err != nil {
		return nil, err
	}
	r.Snapshotter = snapshotter(dir)
	if err := os.WriteFile(filepath.Join(ctrDir, "config.toml"), []byte(r.Runtime.config(ctrDir, r.Snapshotter)), 0o644); err != nil {
		return nil, err
	}
	opts.Logf("starting %s (%s snapshotter) on %s", r.Runtime.Name, r.Snapshotter, r.ContainerdSock)
	if err := r.StartContainerd(); err != nil {
		return nil, err
	}
	return r, nil
}

// StartContainerd starts containerd (again) and waits until CRI answers.
func (r *Rig) StartContainerd() error {
	ctrDir := filepath.Dir(r.ContainerdSock)
	p, err := StartProc("containerd", filepath.Join(ctrDir, "containerd.log"), r.Runtime.env(),
		r.Runtime.bin("containerd"), "--config", filepath.Join(ctrDir, "config.toml"))
	if err != nil {
		return err
	}
	r.containerd = p
	return WaitFor("containerd", p, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return r.CRICall(ctx, func(rt runtimeapi.RuntimeServiceClient) error {
			_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		})
	})
}

// StopContainerd stops containerd gracefully. Running containers keep
// running under their shims, as on a real node.
func (r *Rig) StopContainerd() {
	if r.containerd != nil {
		r.containerd.Stop(15 * time.Second)
	}
}

// Containerd returns the containerd process.
func (r *Rig) Containerd() *Proc { return r.containerd }

// CRICall runs f with a CRI client of the rig's containerd.
func (r *Rig) CRICall(ctx context.Context, f func(runtimeapi.RuntimeServiceClient) error) error {
	conn, err := DialCRI("unix://" + r.ContainerdSock)
	if err != nil {
		return err
	}
	defer conn.Close()
	return f(runtimeapi.NewRuntimeServiceClient(conn))
}

// RegistryRequests returns every request the authenticated registry has
// answered so far, 401s included.
func (r *Rig) RegistryRequests() ([]RegistryRequest, error) {
	return readAccessLog(r.registries[0].Log)
}

// RegistryUsers returns every request the authenticated registry answered
// after authenticating its caller, with the user, in the order they came;
// 401s (no user) are not among them. It needs Options.RegistryUsers.
func (r *Rig) RegistryUsers() ([]UserRequest, error) {
	if !r.opts.RegistryUsers {
		return nil, errors.New("the rig's registry does not log its users: start it with Options.RegistryUsers")
	}
	return readUserLog(r.registries[0].Log)
}

// AnonRegistryRequests returns every request the anonymous view of the
// registry has answered so far.
func (r *Rig) AnonRegistryRequests() ([]RegistryRequest, error) {
	return readAccessLog(r.registries[1].Log)
}

// HostsDir is the rig's containerd's registry config_path (certs.d): the
// proxy's registry check reads the same hosts.toml files.
func (r *Rig) HostsDir() string { return filepath.Join(filepath.Dir(r.ContainerdSock), "certs.d") }

// AddMirror makes containerd pull the registry name from 127.0.0.1:port
// (plain HTTP), e.g. a relay in front of the rig's registry.
func (r *Rig) AddMirror(name string, port int) error {
	return writeHostsToml(filepath.Join(filepath.Dir(r.ContainerdSock), "certs.d"), name, port)
}

// MirrorGCR points containerd's gcr.io mirror (critest's images) at the
// authenticated registry, or back at the anonymous one. containerd reads
// hosts.toml on every pull: no restart needed.
func (r *Rig) MirrorGCR(authenticated bool) error {
	port := r.AnonRegistry
	if authenticated {
		port = r.Registry
	}
	p, err := strconv.Atoi(port[strings.LastIndexByte(port, ':')+1:])
	if err != nil {
		return err
	}
	return writeHostsToml(filepath.Join(filepath.Dir(r.ContainerdSock), "certs.d"), "gcr.io", p)
}

// Result is what a command printed and how it ended.
type Result struct {
	Stdout, Stderr string
	Err            error // nil on exit status 0
}

// Crictl runs the rig's crictl against endpoint (unix:///path) for both
// the runtime and the image service.
func (r *Rig) Crictl(ctx context.Context, endpoint string, args ...string) Result {
	argv := append([]string{"--config", filepath.Join(r.Dir, "crictl.yaml"),
		"--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "60s"}, args...)
	return r.run(ctx, filepath.Join(r.ToolsDir, "crictl"), argv...)
}

// Critest runs the rig's critest against endpoint with extra args.
func (r *Rig) Critest(ctx context.Context, endpoint string, args ...string) Result {
	argv := append([]string{"--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
		"--ginkgo.no-color"}, args...)
	return r.run(ctx, filepath.Join(r.ToolsDir, "critest"), argv...)
}

func (r *Rig) run(ctx context.Context, bin string, args ...string) Result {
	if _, err := os.Stat(filepath.Join(r.Dir, "crictl.yaml")); err != nil {
		// An empty config keeps crictl from looking for /etc/crictl.yaml.
		_ = os.WriteFile(filepath.Join(r.Dir, "crictl.yaml"), []byte("timeout: 60\n"), 0o644)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Dir = r.Dir
	err := cmd.Run()
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Err: err}
}

// RunProxy starts the proxy binary in front of the rig's containerd,
// serving on socket, with extra flags (which may override the defaults),
// and returns at once.
func (r *Rig) RunProxy(bin, socket string, extra ...string) (*Proc, error) {
	return r.runProxy(bin, socket, nil, extra)
}

func (r *Rig) runProxy(bin, socket string, env, extra []string) (*Proc, error) {
	args := append([]string{bin, "serve", "--socket", socket,
		"--runtime-endpoint", "unix://" + r.ContainerdSock, "--monitoring-address", "-", "--log-level", "debug",
		"--registry-hosts-dir", r.HostsDir()}, extra...)
	r.proxies++
	log := filepath.Join(r.Dir, fmt.Sprintf("proxy-%d-%s.log", r.proxies, filepath.Base(socket)))
	return StartProc("cri-image-proxy", log, env, args...)
}

// StartProxy is RunProxy, then waits until the proxy answers on socket.
func (r *Rig) StartProxy(bin, socket string, extra ...string) (*Proc, error) {
	return r.StartProxyEnv(bin, socket, nil, extra...)
}

// StartProxyEnv is StartProxy with env (KEY=VALUE) added to the proxy's
// environment.
func (r *Rig) StartProxyEnv(bin, socket string, env []string, extra ...string) (*Proc, error) {
	p, err := r.runProxy(bin, socket, env, extra)
	if err != nil {
		return nil, err
	}
	err = WaitFor("proxy", p, 30*time.Second, func() error {
		conn, err := DialCRI("unix://" + socket)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
		return err
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// RemoveAllPods stops and removes every pod sandbox, so that no container
// outlives the rig.
func (r *Rig) RemoveAllPods(ctx context.Context) error {
	return r.CRICall(ctx, func(rt runtimeapi.RuntimeServiceClient) error {
		pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			return err
		}
		var errs []error
		for _, p := range pods.Items {
			if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
				errs = append(errs, err)
			}
			if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// Stop removes the pods, stops every process the rig started, unmounts and
// deletes its directory.
func (r *Rig) Stop() error {
	var errs []error
	if r.containerd != nil && r.containerd.Alive() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := r.RemoveAllPods(ctx); err != nil {
			errs = append(errs, fmt.Errorf("remove pods: %w", err))
		}
		cancel()
	}
	r.StopContainerd()
	for _, p := range r.registries {
		p.Stop(10 * time.Second)
	}
	killShims(r.ContainerdSock)
	if err := UnmountUnder(r.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(r.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reapStale cleans up rigs whose owner process died without stopping them
// (a killed test run): their daemons, shims, mounts and directories.
func reapStale(base string, logf func(string, ...any)) {
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // its owner still runs
		}
		logf("reaping stale rig %s", dir)
		killByCwdOrArgs(dir)
		killShims(filepath.Join(dir, "containerd", "containerd.sock"))
		time.Sleep(200 * time.Millisecond)
		_ = UnmountUnder(dir)
		_ = os.RemoveAll(dir)
	}
}

// killByCwdOrArgs kills the processes whose command line mentions dir: the
// daemons a dead rig left behind.
func killByCwdOrArgs(dir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(dir+"/")) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
