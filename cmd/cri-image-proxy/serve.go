package main

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/internal/daemon"
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
			return daemon.Run(cmd.Context(), cfg, daemon.Options{Reload: reload, ConfigPath: configPath, Version: version, BuildInfo: buildInfoMetric()})
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
	fs.StringVar(&e.AdminSocket, "admin-socket", e.AdminSocket, "the records admin socket (root only)")
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
