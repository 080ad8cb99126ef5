package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"

	sd "github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// Options are what the command line gives the daemon besides its
// configuration.
type Options struct {
	// Reload loads the configuration again (the file with the flags) for a
	// reload; ConfigPath is that file ("" for none), watched for changes.
	Reload     func() (*config.ProxyConfiguration, error)
	ConfigPath string
	// Version is the binary's, for the API client's user agent; BuildInfo
	// is the metric that describes the build.
	Version   string
	BuildInfo prometheus.Collector
}

// Run runs the daemon on cfg until ctx is cancelled (SIGTERM, SIGINT),
// then shuts down gracefully. It returns nil after a shutdown, and an
// error when the daemon cannot start or a server fails; either way every
// socket, listener and file it opened is closed when it returns.
func Run(ctx context.Context, cfg *config.ProxyConfiguration, opts Options) error {
	// What is started with ctx (the pod informer) stops however Run returns,
	// before what was opened is closed (a closer may wait for it to stop).
	ctx, cancel := context.WithCancel(ctx)
	d := &daemon{cfg: cfg, opts: opts, log: newLogger(cfg.Logging, os.Stderr), reg: prometheus.NewRegistry()}
	defer func() {
		cancel()
		d.closeAll()
	}()
	logDeprecations(d.log, cfg.Deprecations())
	if err := d.assemble(ctx); err != nil {
		return err
	}
	return d.run(ctx)
}

// daemon is the daemon while it is assembled and run: the parts shared
// between components, the components, and what to close at the end.
type daemon struct {
	cfg  *config.ProxyConfiguration
	opts Options
	log  *slog.Logger
	reg  *prometheus.Registry

	// activated are the sockets systemd passed; taken, those a listener
	// took.
	activated map[string]net.Listener
	taken     map[string]bool

	backend   *criproxy.Backend
	identity  *podtoken.Source      // nil: no kubernetes section
	apiConfig *rest.Config          // nil: no kubernetes section
	injector  *credplugins.Injector // nil: no credentialProviders section
	policy    *imagepolicy.Engine   // nil: no imagePolicy section
	// registry is the registry check of ensure and the image policy; nil
	// when neither is on.
	registry *registry.Checker

	// components run under one errgroup, and are stopped in the order
	// they were added.
	components []component
	// closers close what was opened, in reverse order, when Run returns.
	closers []func() error
}

// component is a part of the daemon that runs until it is stopped.
type component struct {
	// serve runs until stop is called or ctx ends. An error stops the
	// daemon.
	serve func(ctx context.Context) error
	// stop stops it gracefully, within ctx (the shutdown timeout); nil
	// when the end of serve's ctx stops it.
	stop func(ctx context.Context)
}

// add runs c with the daemon.
func (d *daemon) add(c component) { d.components = append(d.components, c) }

// background runs f beside the servers until the daemon stops.
func (d *daemon) background(f func(context.Context)) {
	d.add(component{serve: func(ctx context.Context) error { f(ctx); return nil }})
}

// onExit has close called when Run returns; its error is of no use then.
func (d *daemon) onExit(close func() error) { d.closers = append(d.closers, close) }

func (d *daemon) closeAll() {
	for _, c := range slices.Backward(d.closers) {
		_ = c()
	}
}

// listen listens on the unix socket path, taking the socket systemd passed
// for it if any, and closes it when Run returns.
func (d *daemon) listen(path string, opts unixsock.Options) (*unixsock.Listener, error) {
	opts.Activated = d.activated
	l, err := unixsock.Listen(path, opts)
	if err != nil {
		return nil, err
	}
	d.onExit(l.Close)
	if l.Activated {
		d.taken[path] = true
	}
	return l, nil
}

// listenTCP listens on address and closes the listener when Run returns.
func (d *daemon) listenTCP(address string) (net.Listener, error) {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	d.onExit(l.Close)
	return l, nil
}

// assemble builds every part of the daemon from the configuration and
// opens its sockets; nothing serves yet.
func (d *daemon) assemble(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	// Sockets systemd passed (cri-image-proxy.socket), collected before any
	// plugin runs: the call also keeps them from being inherited.
	var err error
	if d.activated, err = unixsock.Activated(); err != nil {
		return err
	}
	d.taken = map[string]bool{}
	for _, l := range d.activated {
		d.onExit(l.Close)
	}
	if d.backend, err = criproxy.Dial(cfg.RuntimeEndpoint, cfg.ImageEndpoint); err != nil {
		return err
	}
	d.onExit(d.backend.Close)
	// Reconnects as soon as the runtime is back after a restart, and logs
	// when it goes away and comes back.
	d.background(func(ctx context.Context) { d.backend.Watch(ctx, log) })
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), d.opts.BuildInfo)

	if k := cfg.Kubernetes; k != nil {
		if d.identity, d.apiConfig, err = newIdentity(ctx, k, d.opts.Version, log, d.reg); err != nil {
			return err
		}
		d.onExit(func() error { d.identity.Wait(); return nil })
	}
	if cp := cfg.CredentialProviders; cp != nil {
		if d.injector, err = newInjector(cp, d.identity, log, d.reg); err != nil {
			return err
		}
		d.background(func(ctx context.Context) { d.injector.Run(ctx, cp.CachePurgeInterval.Duration) })
		log.Info("credential injection on", "providers", len(d.injector.Config().Providers), "config", cp.Config, "hash", d.injector.Config().Hash)
	}
	if ip := cfg.ImagePolicy; ip != nil {
		if d.policy, err = newImagePolicy(ip, log, d.reg); err != nil {
			return err
		}
		d.background(func(ctx context.Context) { d.policy.Run(ctx, ip.CachePurgeInterval.Duration) })
		pc := d.policy.Config()
		log.Info("image policy on", "providers", len(pc.Providers), "config", ip.Config, "hash", pc.Hash, "defaultNamespace", pc.DefaultNamespace)
		logImagePolicy(log, pc)
	}
	e := cfg.EnsureSecretPulledImages
	if e.Enabled || d.policy != nil {
		if d.registry, err = newRegistryCheck(cfg.RegistryCheck, log, d.reg); err != nil {
			return err
		}
	}
	enf := &enforcement{}
	switch {
	case e.Enabled:
		if enf, err = d.enforce(ctx, e); err != nil {
			return err
		}
	case d.policy != nil:
		enf = d.policyOnly()
	}
	reloader, err := newReloader(d.opts.Reload, cfg,
		reloadTargets{injector: d.injector, guard: enf.guard, registry: d.registry, policy: d.policy}, log, d.reg)
	if err != nil {
		return err
	}
	d.background(func(ctx context.Context) { reloader.Run(ctx, d.opts.ConfigPath) })

	// Components are stopped in the order they are added: the CRI calls in
	// flight finish while monitoring and the admin API still answer.
	if err := d.serveCRI(enf); err != nil {
		return err
	}
	if err := d.monitoring(enf); err != nil {
		return err
	}
	if enf.admin != nil {
		d.add(*enf.admin)
	}
	log.Info("serving CRI", "socket", cfg.Socket.Path, "runtime", d.backend.RuntimeEndpoint,
		"image", d.backend.ImageEndpoint, "monitoring", cfg.Monitoring.Address)
	return nil
}

// serveCRI adds the CRI server on the proxy's socket, with the
// interceptors of what is on, outermost first. With ensure, the guard's
// PullImage is the whole chain of a pull (credential injection's tries,
// the registry's word on each beside the runtime's pull, the image
// policy's decision, the record), so injection adds no interceptor of its
// own; without it, injection's PullImage makes the tries and the image
// policy's decides each, innermost. criproxy.New refuses a list assembled
// otherwise (Sole, Innermost).
func (d *daemon) serveCRI(enf *enforcement) error {
	interceptors := slices.Clone(enf.interceptors)
	if d.injector != nil && enf.guard == nil {
		interceptors = append(interceptors, d.injector.Interceptors()...)
	}
	interceptors = append(interceptors, enf.inner...)
	proxy, err := criproxy.New(d.backend, criproxy.Options{Logger: d.log, Registerer: d.reg, Interceptors: interceptors})
	if err != nil {
		return err
	}
	path := d.cfg.Socket.Path
	sock, err := d.listen(path, unixsock.Options{Group: d.cfg.Socket.Group})
	if err != nil {
		return err
	}
	if sock.Activated {
		d.log.Info("the CRI socket is systemd's (socket activation): calls during a restart wait for the next instance", "socket", path)
	}
	for p := range d.activated {
		if !d.taken[p] {
			return fmt.Errorf("systemd passed the socket %s, which is neither socket.path (%s) nor the admin socket: make the .socket unit's ListenStream the configured path", p, path)
		}
	}
	d.add(component{
		serve: func(context.Context) error {
			if err := proxy.Serve(sock); err != nil {
				return fmt.Errorf("serving CRI on %s: %w", path, err)
			}
			return nil
		},
		// The gRPC server closes sock, which releases the instance lock.
		stop: proxy.Shutdown,
	})
	return nil
}

// monitoring adds the monitoring endpoint and the secure one, those that
// are on.
func (d *daemon) monitoring(enf *enforcement) error {
	m := d.cfg.Monitoring
	// Built first (its errors come first), stopped last.
	var secure *component
	if sm := m.Secure; sm != nil {
		srv, err := newSecureMonitoring(sm, d.cfg.Kubernetes.NodeName, d.apiConfig, d.reg, d.log)
		if err != nil {
			return err
		}
		l, err := d.listenTCP(sm.Address)
		if err != nil {
			return fmt.Errorf("secure monitoring address: %w", err)
		}
		secure = &component{
			serve: func(context.Context) error { return srv.ServeTLS(l) },
			stop:  func(ctx context.Context) { _ = srv.Shutdown(ctx) },
		}
	}
	if m.Address != "-" {
		srv, err := monitoring.New(d.reg, d.reg, d.backend.Ready, d.log, monitoring.Options{Profiling: m.Profiling, Checks: enf.readyChecks})
		if err != nil {
			return err
		}
		l, err := d.listenTCP(m.Address)
		if err != nil {
			return fmt.Errorf("monitoring address: %w", err)
		}
		d.add(component{
			serve: func(context.Context) error { return srv.Serve(l) },
			stop:  func(ctx context.Context) { _ = srv.Shutdown(ctx) },
		})
	}
	if secure != nil {
		d.add(*secure)
	}
	return nil
}

// run runs the components under one errgroup until ctx ends or one
// fails, then stops them all within the shutdown timeout.
func (d *daemon) run(ctx context.Context) error {
	// Under systemd (Type=notify) the unit is started, and the kubelet
	// ordered after it may start, once the socket accepts calls: from here
	// on a connection waits in the listen backlog until Serve takes it.
	if _, err := sd.SdNotify(false, sd.SdNotifyReady); err != nil {
		d.log.Warn("telling systemd the proxy is ready failed", "err", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range d.components {
		g.Go(func() error { return c.serve(gctx) })
	}
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			d.log.Info("shutting down: no new calls; waiting for calls in flight", "timeout", d.cfg.ShutdownTimeout.Duration)
		}
		_, _ = sd.SdNotify(false, sd.SdNotifyStopping)
		sctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout.Duration)
		defer cancel()
		for _, c := range d.components {
			if c.stop != nil {
				c.stop(sctx)
			}
		}
		return nil
	})
	err := g.Wait()
	if err == nil || errors.Is(err, context.Canceled) {
		d.log.Info("stopped")
		return nil
	}
	return err
}
