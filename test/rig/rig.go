package rig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	// Runtime is the runtime to run (containerd or CRI-O); the zero value
	// is RuntimeFromEnv.
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
	Dir      string // the rig's directory; logs are here
	ToolsDir string
	// RuntimeSock is the runtime's CRI socket (a path), containerd's or
	// CRI-O's: what a kubelet dials, the proxy's runtime endpoint.
	RuntimeSock string
	// ContainerdSock is containerd's socket (CRI and containerd's own API),
	// the same as RuntimeSock on containerd and "" on CRI-O.
	ContainerdSock string
	Registry       string // authenticated registry, 127.0.0.1:port
	AnonRegistry   string // the same storage without authentication
	// Snapshotter is where images unpack: containerd's overlayfs or native
	// snapshotter; CRI-O's storage driver is overlay or vfs for them.
	Snapshotter string
	Runtime     Runtime
	// ProxyNice is the niceness proxies are started at (nice -n), as the
	// shipped systemd unit's Nice= gives the daemon; 0 starts them at the
	// rig's own.
	ProxyNice int

	opts       Options
	proxies    int   // proxies started, to name their logs
	runtime    *Proc // containerd or crio
	registries []*Proc

	// CRI-O only: the names registries.conf rewrites to 127.0.0.1:port
	// (and their mirrors), and the pod network's subnet.
	mirrorsMu sync.Mutex
	mirrors   map[string]route
	podSubnet *net.IPNet
}

// PodAddressPrefix is how the address of a pod on the pod network starts:
// containerd's rig runs a CNI plugin that reports 127.0.0.2 and configures
// nothing; CRI-O's a bridge of its own with a /24 ("10.89.N.").
func (r *Rig) PodAddressPrefix() string {
	if r.podSubnet == nil {
		return "127.0.0.2"
	}
	ip := r.podSubnet.IP.To4()
	return fmt.Sprintf("%d.%d.%d.", ip[0], ip[1], ip[2])
}

// DefaultToolsDir is where hack/install-deps.sh puts crictl and critest.
func DefaultToolsDir() string {
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		return d
	}
	return "/var/cache/cri-image-proxy/tools"
}

// Start starts the registries, pushes the test images and starts the
// runtime (containerd or CRI-O, Options.Runtime).
// On error, whatever was started is stopped again.
func Start(opts Options) (r *Rig, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the rig needs root (the runtime, mounts)")
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
	r = &Rig{Dir: dir, ToolsDir: opts.ToolsDir, Runtime: opts.Runtime, opts: opts}
	if r.Runtime.CRIO() {
		r.RuntimeSock = filepath.Join(dir, "crio", "crio.sock")
	} else {
		r.ContainerdSock = filepath.Join(dir, "containerd", "containerd.sock")
		r.RuntimeSock = r.ContainerdSock
	}
	// Every error return below sets r to nil: stop what was started
	// through a copy.
	started := r
	defer func() {
		if err != nil {
			started.Stop()
			r = nil
		}
	}()

	// Registries first: the runtime's mirrors point at them.
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

	gcrPort := anonPort
	if opts.GCRAuthed {
		gcrPort = regPort
	}
	r.Snapshotter = snapshotter(dir)
	if r.Runtime.CRIO() {
		if err := r.setupCRIO(regPort, anonPort, gcrPort); err != nil {
			return nil, err
		}
	} else if err := r.setupContainerd(regPort, anonPort, gcrPort); err != nil {
		return nil, err
	}
	opts.Logf("starting %s (%s) on %s", r.Runtime.Name, r.Snapshotter, r.RuntimeSock)
	if err := r.StartRuntime(); err != nil {
		return nil, err
	}
	return r, nil
}

// setupContainerd writes the rig's containerd configuration under
// dir/containerd: config.toml, hosts.toml per registry name, the CNI.
func (r *Rig) setupContainerd(regPort, anonPort, gcrPort int) error {
	ctrDir := filepath.Dir(r.ContainerdSock)
	certs := filepath.Join(ctrDir, "certs.d")
	for name, port := range map[string]int{
		r.Registry:          regPort,
		"registry.rig.test": regPort, // the authenticated registry under a DNS-like name
		"gcr.io":            gcrPort, // critest's images
		"registry.k8s.io":   anonPort,
	} {
		if err := writeHostsToml(certs, name, port); err != nil {
			return err
		}
	}
	if err := writeCNI(filepath.Join(ctrDir, "cni")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(ctrDir, "config.toml"), []byte(r.Runtime.config(ctrDir, r.Snapshotter)), 0o644)
}

// StartRuntime starts the runtime (again) and waits until CRI answers on
// RuntimeSock.
func (r *Rig) StartRuntime() error {
	var p *Proc
	var err error
	if r.Runtime.CRIO() {
		p, err = r.startCRIO()
	} else {
		ctrDir := filepath.Dir(r.ContainerdSock)
		p, err = StartProc("containerd", filepath.Join(ctrDir, "containerd.log"), r.Runtime.env(),
			r.Runtime.bin("containerd"), "--config", filepath.Join(ctrDir, "config.toml"))
	}
	if err != nil {
		return err
	}
	r.runtime = p
	return WaitFor(r.Runtime.Name, p, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return r.CRICall(ctx, func(rt runtimeapi.RuntimeServiceClient) error {
			_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		})
	})
}

// StopRuntime stops the runtime gracefully. Running containers keep
// running under their shims (containerd) or conmon (CRI-O), as on a real
// node.
func (r *Rig) StopRuntime() {
	if r.runtime != nil {
		r.runtime.Stop(15 * time.Second)
	}
}

// RuntimeProc returns the runtime's process (containerd or crio).
func (r *Rig) RuntimeProc() *Proc { return r.runtime }

// CRICall runs f with a CRI client of the rig's runtime.
func (r *Rig) CRICall(ctx context.Context, f func(runtimeapi.RuntimeServiceClient) error) error {
	conn, err := DialCRI("unix://" + r.RuntimeSock)
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
// proxy's registry check reads the same hosts.toml files. "" on CRI-O,
// whose registries are in RegistriesConf.
func (r *Rig) HostsDir() string {
	if r.ContainerdSock == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(r.ContainerdSock), "certs.d")
}

// RegistriesConf is the rig's CRI-O's registries.conf (containers-
// registries.conf(5)); "" on containerd, whose registries are in HostsDir.
func (r *Rig) RegistriesConf() string {
	if !r.Runtime.CRIO() {
		return ""
	}
	return filepath.Join(r.crioDir(), "registries.conf")
}

// ProxyRegistryFlags are the proxy's flags that point its registry check
// at the runtime's registry configuration, so that it reaches a name's
// registry where the runtime does: --registry-hosts-dir on containerd. On
// CRI-O too, naming the same registries (and mirrors, SetMirror) as
// registries.conf in hosts.toml files (proxyHostsDir), as long as the
// proxy reads no registries.conf.
func (r *Rig) ProxyRegistryFlags() []string {
	if r.Runtime.CRIO() {
		return []string{"--registry-hosts-dir", r.proxyHostsDir()}
	}
	return []string{"--registry-hosts-dir", r.HostsDir()}
}

// AddMirror makes the runtime pull the registry name from 127.0.0.1:port
// (plain HTTP), e.g. a relay in front of the rig's registry. containerd
// reads hosts.toml on every pull; CRI-O is told to read registries.conf
// again (SIGHUP), and AddMirror returns once it has.
func (r *Rig) AddMirror(name string, port int) error {
	if !r.Runtime.CRIO() {
		return writeHostsToml(r.HostsDir(), name, port)
	}
	return r.setRoute(name, route{location: port})
}

// SetMirror makes the runtime pull name from the plain-HTTP mirror on
// 127.0.0.1:mirrorPort first and from its registry on
// 127.0.0.1:serverPort after it, as a node whose mirror (a pull-through
// cache, a peer) serves a registry's content does: containerd from
// name's hosts.toml (a [host] before the server), CRI-O from
// registries.conf (a [[registry.mirror]] of name's [[registry]], read
// again as AddMirror has it read). The proxy's registry check
// (ProxyRegistryFlags) asks the server: a mirror is not the registry.
// AddMirror(name, serverPort) puts the route without a mirror back.
//
// A pull's credential reaches the server the way the runtime sends it:
// containerd sends it wherever it pulls name from; CRI-O only to the host
// an image's name names, never to a mirror or a rewritten location, so a
// test whose CRI-O pull needs one names the server by its address.
func (r *Rig) SetMirror(name string, mirrorPort, serverPort int) error {
	if !r.Runtime.CRIO() {
		return writeMirroredHostsToml(r.HostsDir(), name, serverPort, mirrorPort)
	}
	return r.setRoute(name, route{location: serverPort, mirror: mirrorPort})
}

// setRoute makes CRI-O pull name by rt, and returns once it reads it.
func (r *Rig) setRoute(name string, rt route) error {
	r.mirrorsMu.Lock()
	defer r.mirrorsMu.Unlock()
	r.mirrors[name] = rt
	if err := r.writeRegistriesConf(); err != nil {
		return err
	}
	return r.reloadCRIO()
}

// RemoveMirror undoes AddMirror: the runtime no longer knows name (a pull
// of it goes to name itself, which on this offline machine fails).
func (r *Rig) RemoveMirror(name string) error {
	if !r.Runtime.CRIO() {
		return os.RemoveAll(filepath.Join(r.HostsDir(), name))
	}
	r.mirrorsMu.Lock()
	defer r.mirrorsMu.Unlock()
	delete(r.mirrors, name)
	if err := r.writeRegistriesConf(); err != nil {
		return err
	}
	return r.reloadCRIO()
}

// MirrorGCR points the runtime's gcr.io mirror (critest's images) at the
// authenticated registry, or back at the anonymous one, as AddMirror does.
func (r *Rig) MirrorGCR(authenticated bool) error {
	port := r.AnonRegistry
	if authenticated {
		port = r.Registry
	}
	p, err := strconv.Atoi(port[strings.LastIndexByte(port, ':')+1:])
	if err != nil {
		return err
	}
	return r.AddMirror("gcr.io", p)
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

// RunProxy starts the proxy binary in front of the rig's runtime,
// serving on socket, with extra flags (which may override the defaults),
// and returns at once.
func (r *Rig) RunProxy(bin, socket string, extra ...string) (*Proc, error) {
	return r.runProxy(bin, socket, nil, extra)
}

func (r *Rig) runProxy(bin, socket string, env, extra []string) (*Proc, error) {
	args := append([]string{bin, "serve", "--socket", socket,
		"--runtime-endpoint", "unix://" + r.RuntimeSock, "--monitoring-address", "-", "--log-level", "debug"}, r.ProxyRegistryFlags()...)
	args = append(args, extra...)
	if r.ProxyNice != 0 {
		args = append([]string{"nice", "-n", strconv.Itoa(r.ProxyNice)}, args...)
	}
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
		// Containers first, killed at once (timeout 0): CRI-O's
		// StopPodSandbox sends them their stop signal and waits out the
		// call's deadline for any that ignores it (a shell as PID 1 does),
		// where containerd kills them.
		ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return err
		}
		for _, c := range ctrs.Containers {
			if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
				if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.Id}); err != nil {
					errs = append(errs, err)
				}
			}
		}
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
	if r.runtime != nil && r.runtime.Alive() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := r.RemoveAllPods(ctx); err != nil {
			errs = append(errs, fmt.Errorf("remove pods: %w", err))
		}
		cancel()
	}
	r.StopRuntime()
	for _, p := range r.registries {
		p.Stop(10 * time.Second)
	}
	if r.Runtime.CRIO() {
		cleanupCRIO(r.crioDir(), r.Runtime.Dir)
	} else {
		killShims(r.ContainerdSock)
	}
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
		if crio := filepath.Join(dir, "crio"); crioToolsDir(crio) != "" {
			// Containers first: once crio and conmon are dead, only the
			// OCI runtime's state still knows them.
			cleanupCRIO(crio, crioToolsDir(crio))
		}
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
