package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
)

func newServeCmd() *cobra.Command {
	var configPath string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve CRI on a unix socket, forwarding to the container runtime",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadServeConfig(cmd.Flags(), configPath)
			if err != nil {
				return err
			}
			reload := func() (*config.ProxyConfiguration, error) { return loadServeConfig(cmd.Flags(), configPath) }
			return serve(cmd.Context(), cfg, reload, configPath)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "configuration file ("+config.APIVersion+" "+config.Kind+"); flags override it")
	// Bound to a configuration of defaults here, for parsing and --help;
	// loadServeConfig binds them again onto the loaded file.
	bindServeFlags(cmd.Flags(), config.Default())
	return cmd
}

// bindServeFlags binds the serve flags onto cfg's fields: the one list of
// flags, their names, help and defaults (cfg's values). As the kubelet
// does (kubeletConfigFlagPrecedence), a flag the user set overrides the
// file because it is bound again onto the decoded file and set there.
// Optional sections are allocated to bind them; sectionFlags says which
// flags make one present.
func bindServeFlags(fs *pflag.FlagSet, cfg *config.ProxyConfiguration) {
	if cfg.CredentialProviders == nil {
		cfg.CredentialProviders = &config.CredentialProviders{}
	}
	if cfg.Kubernetes == nil {
		cfg.Kubernetes = &config.Kubernetes{}
	}
	if cfg.Monitoring.Secure == nil {
		cfg.Monitoring.Secure = &config.SecureMonitoring{}
	}
	fs.StringVar(&cfg.Socket.Path, "socket", cfg.Socket.Path, "unix socket to serve CRI on")
	fs.StringVar(&cfg.Socket.Group, "socket-group", cfg.Socket.Group, "group that may use the socket (mode 0660), a name or a GID")
	fs.StringVar(&cfg.RuntimeEndpoint, "runtime-endpoint", cfg.RuntimeEndpoint, "the container runtime's CRI endpoint")
	fs.StringVar(&cfg.ImageEndpoint, "image-endpoint", cfg.ImageEndpoint, "a separate CRI image service endpoint, as the kubelet's --image-service-endpoint")
	fs.StringVar(&cfg.Monitoring.Address, "monitoring-address", cfg.Monitoring.Address, "host:port for /metrics, /healthz and /readyz; - turns it off")
	fs.BoolVar(&cfg.Monitoring.Profiling, "profiling", cfg.Monitoring.Profiling, "serve Go's pprof handlers under /debug/pprof/ on the monitoring address")
	sm := cfg.Monitoring.Secure
	fs.StringVar(&sm.Address, "secure-monitoring-address", sm.Address, "host:port for /metrics over TLS, for callers the API authorizes to get nodes/metrics (needs --kubeconfig)")
	fs.StringVar(&sm.CertFile, "tls-cert-file", sm.CertFile, "the TLS certificate of the secure monitoring address (default: self-signed)")
	fs.StringVar(&sm.KeyFile, "tls-private-key-file", sm.KeyFile, "the TLS key of the secure monitoring address")
	fs.DurationVar(&cfg.ShutdownTimeout.Duration, "shutdown-timeout", cfg.ShutdownTimeout.Duration, "how long calls in flight may finish after SIGTERM")
	fs.StringVar(&cfg.Logging.Level, "log-level", cfg.Logging.Level, "debug, info, warn or error; debug logs every CRI call (never its content)")
	fs.StringVar(&cfg.Logging.Format, "log-format", cfg.Logging.Format, "text or json")
	cp := cfg.CredentialProviders
	fs.StringVar(&cp.Config, "image-credential-provider-config", cp.Config, "the kubelet's CredentialProviderConfig (file or directory): inject its plugins' credentials into pulls without any")
	fs.StringVar(&cp.BinDir, "image-credential-provider-bin-dir", cp.BinDir, "the directory of the credential provider plugin executables")
	k := cfg.Kubernetes
	fs.StringVar(&k.Kubeconfig, "kubeconfig", k.Kubeconfig, "kubeconfig for the Kubernetes API (service-account token providers, pod-aware ensure decisions); its user may be an exec plugin")
	fs.StringVar(&k.NodeName, "node-name", k.NodeName, "this node's name in the Kubernetes API (default: the host name)")
	e := &cfg.EnsureSecretPulledImages
	fs.BoolVar(&e.Enabled, "ensure-secret-pulled-images", e.Enabled, "enforce KEP-2535: an image pulled with credentials goes only to pods whose credentials were verified for it")
	fs.StringVar(&e.ImagePullCredentialsVerificationPolicy, "image-pull-credentials-verification-policy", e.ImagePullCredentialsVerificationPolicy, "the kubelet's policy, one of:\n"+ensure.PolicyHelp())
	fs.StringVar(&e.DatabasePath, "ensure-database", e.DatabasePath, "the records database (bbolt)")
	fs.StringVar(&e.AdminSocket, "admin-socket", e.AdminSocket, "the records admin socket (root, and --admin-group)")
	fs.StringVar(&e.AdminGroup, "admin-group", e.AdminGroup, "group that may use the records admin socket besides root, a name or a GID (checked on each caller's credentials)")
}

// sectionFlags are the flags that make an optional section present.
var sectionFlags = struct{ credentialProviders, kubernetes, secureMonitoring []string }{
	credentialProviders: []string{"image-credential-provider-config", "image-credential-provider-bin-dir"},
	kubernetes:          []string{"kubeconfig", "node-name"},
	secureMonitoring:    []string{"secure-monitoring-address", "tls-cert-file", "tls-private-key-file"},
}

// loadServeConfig reads the configuration file, if any, lets the flags the
// user set (in parsed) override it, and validates the result.
func loadServeConfig(parsed *pflag.FlagSet, configPath string) (*config.ProxyConfiguration, error) {
	cfg := config.Default()
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if cfg, err = config.Decode(data); err != nil {
			return nil, fmt.Errorf("config %s: %w", configPath, err)
		}
	}
	hadProviders, hadKubernetes, hadSecure := cfg.CredentialProviders != nil, cfg.Kubernetes != nil, cfg.Monitoring.Secure != nil
	onto := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	bindServeFlags(onto, cfg)
	var errs []error
	parsed.Visit(func(f *pflag.Flag) {
		if onto.Lookup(f.Name) == nil {
			return // --config
		}
		if err := onto.Set(f.Name, f.Value.String()); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", f.Name, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	changed := func(names []string) bool { return slices.ContainsFunc(names, parsed.Changed) }
	if !hadProviders && !changed(sectionFlags.credentialProviders) {
		cfg.CredentialProviders = nil
	}
	if !hadKubernetes && !changed(sectionFlags.kubernetes) {
		cfg.Kubernetes = nil
	}
	if !hadSecure && !changed(sectionFlags.secureMonitoring) {
		cfg.Monitoring.Secure = nil
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		if configPath != "" {
			return nil, fmt.Errorf("config %s with flags: %w", configPath, err)
		}
		return nil, fmt.Errorf("flags: %w", err)
	}
	return cfg, nil
}

// newLogger returns the daemon's logger, writing to w, and sends
// client-go's klog output through it too: one format (JSON mode is all
// JSON), one level filter.
func newLogger(l config.Logging, w io.Writer) *slog.Logger {
	level, _ := l.SlogLevel() // validated
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if l.Format == "json" {
		log = slog.New(slog.NewJSONHandler(w, opts))
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	klog.SetSlogLogger(log)
	return log
}

// serve runs the daemon until ctx is cancelled (SIGTERM, SIGINT), then
// shuts down gracefully.
// serve runs the daemon on cfg; reload loads the configuration again (the
// file at configPath with the flags) for a reload.
func serve(ctx context.Context, cfg *config.ProxyConfiguration, reload func() (*config.ProxyConfiguration, error), configPath string) error {
	log := newLogger(cfg.Logging, os.Stderr)
	// Sockets systemd passed (cri-image-proxy.socket), collected before any
	// plugin runs: the call also keeps them from being inherited.
	activated, err := unixsock.Activated()
	if err != nil {
		return err
	}
	backend, err := criproxy.Dial(cfg.RuntimeEndpoint, cfg.ImageEndpoint)
	if err != nil {
		return err
	}
	defer backend.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric())

	// Interceptors, outermost first.
	var interceptors []criproxy.Interceptor
	var background []func(context.Context)
	var identity *podtoken.Source
	var apiConfig *rest.Config
	if k := cfg.Kubernetes; k != nil {
		if identity, apiConfig, err = newIdentity(ctx, k, log, reg); err != nil {
			return err
		}
	}
	// accounts re-checks service-account re-uses against the token plugins
	// (nil without plugins: such a re-use is then never made).
	var accounts ensure.AccountCheck
	var injector *credplugins.Injector
	if cp := cfg.CredentialProviders; cp != nil {
		injector, err = newInjector(cp, identity, log, reg)
		if err != nil {
			return err
		}
		interceptors = append(interceptors, injector.Interceptors()...)
		accounts = injector
		background = append(background, func(ctx context.Context) { injector.Run(ctx, cp.CachePurgeInterval.Duration) })
		log.Info("credential injection on", "providers", len(injector.Config().Providers), "config", cp.Config, "hash", injector.Config().Hash)
	}
	var readyChecks []monitoring.ReadyFunc
	var adminServer *http.Server
	var guard *ensure.Guard
	var adminListener net.Listener
	if e := cfg.EnsureSecretPulledImages; e.Enabled {
		callers, adminOpts, err := adminSocketAccess(e.AdminGroup, activated)
		if err != nil {
			return err
		}
		var store *records.Store
		var retry func(context.Context)
		guard, store, retry, err = newGuard(ctx, e, backend, identity, accounts, log, reg)
		if err != nil {
			return err
		}
		if retry != nil {
			background = append(background, retry)
		}
		interceptors = append(guard.Interceptors(), interceptors...) // outermost: it sees what the injector did
		readyChecks = append(readyChecks, func(context.Context) error { return guard.RecordsAvailable() })
		// Without the database there is nothing to administer: the records
		// commands then open the file themselves and report its error.
		if store != nil {
			defer store.Close()
			background = append(background, func(ctx context.Context) { guard.Run(ctx, e.GCInterval.Duration) })
			l, err := unixsock.Listen(e.AdminSocket, adminOpts)
			if err != nil {
				return fmt.Errorf("admin socket: %w", err)
			}
			adminListener = l
			adminServer = admin.NewServer(&admin.Local{Store: store, Core: guard, Daemon: guard}, callers, log)
		}
		log.Info("ensure secret-pulled images on", "policy", e.ImagePullCredentialsVerificationPolicy, "maxRecordAge", e.MaxRecordAge.Duration, "maxRecordAgeByRepository", len(e.MaxRecordAgeByRepository), "database", e.DatabasePath, "adminSocket", e.AdminSocket, "adminCallers", callers.String(), "recordsAvailable", store != nil)
	}
	reloader, err := newReloader(reload, cfg, injector, guard, log, reg)
	if err != nil {
		return err
	}
	background = append(background, func(ctx context.Context) { reloader.Run(ctx, configPath) })

	proxy, err := criproxy.New(backend, criproxy.Options{Logger: log, Registerer: reg, Interceptors: interceptors})
	if err != nil {
		return err
	}

	sock, err := unixsock.Listen(cfg.Socket.Path, unixsock.Options{Group: cfg.Socket.Group, Activated: activated})
	if err != nil {
		return err
	}
	if sock.Activated {
		log.Info("the CRI socket is systemd's (socket activation): calls made during a restart wait for the next instance", "socket", cfg.Socket.Path)
	}
	for path, l := range activated {
		if path != cfg.Socket.Path && (adminListener == nil || path != adminListener.Addr().String()) {
			l.Close()
			sock.Close()
			return fmt.Errorf("systemd passed the socket %s, which is neither socket.path (%s) nor the admin socket: make the .socket unit's ListenStream the configured path", path, cfg.Socket.Path)
		}
	}
	var secure *monitoring.Server
	var secureListener net.Listener
	if sm := cfg.Monitoring.Secure; sm != nil {
		if secure, err = newSecureMonitoring(sm, cfg.Kubernetes.NodeName, apiConfig, reg, log); err != nil {
			sock.Close()
			return err
		}
		if secureListener, err = net.Listen("tcp", sm.Address); err != nil {
			sock.Close()
			return fmt.Errorf("secure monitoring address: %w", err)
		}
	}
	var mon *monitoring.Server
	var monListener net.Listener
	if cfg.Monitoring.Address != "-" {
		if mon, err = monitoring.New(reg, reg, backend.Ready, log, monitoring.Options{Profiling: cfg.Monitoring.Profiling, Checks: readyChecks}); err != nil {
			sock.Close()
			return err
		}
		if monListener, err = net.Listen("tcp", cfg.Monitoring.Address); err != nil {
			sock.Close()
			return fmt.Errorf("monitoring address: %w", err)
		}
	}

	log.Info("serving CRI", "socket", cfg.Socket.Path, "runtime", backend.RuntimeEndpoint,
		"image", backend.ImageEndpoint, "monitoring", cfg.Monitoring.Address)
	// Under systemd (Type=notify) the unit is started, and the kubelet
	// ordered after it may start, once the socket accepts calls: from here
	// on a connection waits in the listen backlog until Serve takes it.
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("telling systemd the proxy is ready failed", "err", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, run := range background {
		g.Go(func() error { run(gctx); return nil })
	}
	g.Go(func() error {
		if err := proxy.Serve(sock); err != nil {
			return fmt.Errorf("serving CRI on %s: %w", cfg.Socket.Path, err)
		}
		return nil
	})
	if mon != nil {
		g.Go(func() error { return mon.Serve(monListener) })
	}
	if secure != nil {
		g.Go(func() error { return secure.ServeTLS(secureListener) })
	}
	if adminServer != nil {
		g.Go(func() error {
			if err := adminServer.Serve(adminListener); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("admin socket: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			log.Info("shutting down: no new calls; waiting for calls in flight", "timeout", cfg.ShutdownTimeout.Duration)
		}
		_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.Duration)
		defer cancel()
		proxy.Shutdown(sctx)
		sock.Close() // the gRPC server closed the listener; this releases the instance lock
		if mon != nil {
			_ = mon.Shutdown(sctx)
		}
		if secure != nil {
			_ = secure.Shutdown(sctx)
		}
		if adminServer != nil {
			_ = adminServer.Shutdown(sctx)
		}
		return nil
	})
	err = g.Wait()
	if err == nil || errors.Is(err, context.Canceled) {
		log.Info("stopped")
		return nil
	}
	return err
}

// adminSocketAccess says who may use the admin socket (root, and group
// when set) and how to make it: mode 0600, or 0660 of that group. The
// server checks each caller's credentials as well (admin.NewServer), so a
// socket systemd made with another mode is held to the same rule.
func adminSocketAccess(group string, activated map[string]net.Listener) (admin.Callers, unixsock.Options, error) {
	if group == "" {
		return admin.Callers{}, unixsock.Options{Mode: 0o600, Activated: activated}, nil
	}
	gid, err := unixsock.LookupGroup(group)
	if err != nil {
		return admin.Callers{}, unixsock.Options{}, fmt.Errorf("ensureSecretPulledImages.adminGroup: %w", err)
	}
	return admin.Callers{Group: uint32(gid), HasGroup: true}, unixsock.Options{Mode: 0o660, Group: strconv.Itoa(gid), Activated: activated}, nil
}

// newSecureMonitoring is the TLS /metrics endpoint, its callers reviewed
// by the API with the proxy's identity.
func newSecureMonitoring(sm *config.SecureMonitoring, node string, api *rest.Config, gatherer prometheus.Gatherer, log *slog.Logger) (*monitoring.Server, error) {
	var cert tls.Certificate
	var err error
	if sm.CertFile != "" {
		cert, err = tls.LoadX509KeyPair(sm.CertFile, sm.KeyFile)
	} else {
		host, _, _ := net.SplitHostPort(sm.Address) // validated
		cert, err = monitoring.SelfSigned(node, host, "localhost", "127.0.0.1")
	}
	if err != nil {
		return nil, fmt.Errorf("secure monitoring certificate: %w", err)
	}
	reviewer, err := podtoken.NewReviewer(api, node)
	if err != nil {
		return nil, err
	}
	log.Info("secure monitoring on", "address", sm.Address, "selfSigned", sm.CertFile == "")
	return monitoring.NewSecure(gatherer, cert, reviewer.Allowed, log), nil
}

// newInjector loads the credential provider configuration and builds the
// PullImage hook that injects its plugins' credentials.
func newInjector(cp *config.CredentialProviders, identity *podtoken.Source, log *slog.Logger, reg prometheus.Registerer) (*credplugins.Injector, error) {
	pc, err := credplugins.LoadConfig(cp.Config, cp.BinDir)
	if err != nil {
		return nil, err
	}
	opts := credplugins.Options{
		ExecTimeout: cp.ExecTimeout.Duration,
		CacheSize:   cp.CacheSize,
		Logger:      log,
		Registerer:  reg,
	}
	if identity != nil {
		opts.Identity = identity
	}
	return credplugins.New(pc, opts)
}

// newIdentity connects to the Kubernetes API and starts the node's pod
// informer (waiting a little for it: without it, pods are read with GETs).
func newIdentity(ctx context.Context, k *config.Kubernetes, log *slog.Logger, reg prometheus.Registerer) (*podtoken.Source, *rest.Config, error) {
	if err := podtoken.RegisterClientMetrics(reg); err != nil {
		return nil, nil, err
	}
	var rc *rest.Config
	var err error
	if k.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes API: %w", err)
	}
	rc.UserAgent = "cri-image-proxy/" + version
	rc.QPS, rc.Burst = k.QPS, k.Burst
	api, err := podtoken.NewAPI(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes API: %w", err)
	}
	src := podtoken.New(api, k.NodeName, podtoken.Options{Logger: log})
	src.Start(ctx)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !src.WaitForSync(wctx) {
		log.Warn("the pod informer has not synced yet; reading pods one by one meanwhile", "node", k.NodeName)
	}
	log.Info("kubernetes API on", "host", rc.Host, "node", k.NodeName)
	return src, rc, nil
}

// newGuard opens the records database and builds the ensure interceptors,
// after settling the pull intents a crash left. When the runtime does not
// answer, retry (non-nil) settles them in the background until it does;
// their images need verification meanwhile. When the database cannot be
// opened, the guard fails closed over ensure.UnavailableStore and the
// store is nil.
func newGuard(ctx context.Context, e config.EnsureSecretPulledImages, backend *criproxy.Backend, identity *podtoken.Source, accounts ensure.AccountCheck, log *slog.Logger, reg prometheus.Registerer) (_ *ensure.Guard, _ *records.Store, retry func(context.Context), _ error) {
	policy, err := ensure.NewPolicy(ensure.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)
	if err != nil {
		return nil, nil, nil, err
	}
	opts := ensure.GuardOptions{Logger: log, Registerer: reg, GracePeriod: e.GracePeriod.Duration, Accounts: accounts}
	if identity != nil {
		opts.Pods = identity
	}
	rt := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(backend.Image), runtimeapi.NewRuntimeServiceClient(backend.Runtime))
	store, err := records.Open(e.DatabasePath, records.Options{})
	if err != nil {
		// The proxy is the kubelet's runtime endpoint: refusing to start
		// would take the node down. Serve, and fail closed instead.
		log.Error("the records database cannot be opened: serving the runtime, but refusing every image that needs verification until it can be and the proxy is restarted. "+
			"Restore the file from a backup, or move it aside and remove the images pulled with credentials (a new database takes present images for preloaded ones under NeverVerifyPreloadedImages); see docs/operations.md",
			"database", e.DatabasePath, "err", err)
		guard, gerr := ensure.NewGuard(ensure.UnavailableStore(err), policy, rt, opts)
		if gerr == nil {
			guard.SetExpiry(e.Expiry())
		}
		return guard, nil, nil, gerr
	}
	guard, err := ensure.NewGuard(store, policy, rt, opts)
	if err != nil {
		store.Close()
		return nil, nil, nil, err
	}
	guard.SetExpiry(e.Expiry())
	settle := func() error {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, k, err := guard.Recover(rctx)
		if n+k > 0 && err == nil {
			log.Info("settled the pull intents of an interrupted run; those whose image is not on the node are kept until it is, or it is pulled again",
				"toRecords", n, "kept", k)
		}
		return err
	}
	if err := settle(); err != nil {
		log.Warn("settling pull intents failed; retrying, their images need verification meanwhile", "err", err)
		retry = func(ctx context.Context) {
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if settle() == nil {
						return
					}
				}
			}
		}
	}
	return guard, store, retry, nil
}
