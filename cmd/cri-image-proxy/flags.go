package main

import (
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

// addConfigFlags gives cmd --config and every serve flag, and returns
// where --config goes. The flags are bound to a configuration of defaults
// here, for parsing and --help; loadServeConfig binds them again onto the
// loaded file.
func addConfigFlags(cmd *cobra.Command) *string {
	var configPath string
	cmd.Flags().StringVar(&configPath, "config", "", "configuration file ("+config.APIVersion+" "+config.Kind+"); flags override it")
	bindServeFlags(cmd.Flags(), config.Default())
	return &configPath
}

// loadServeConfig reads the configuration file, if any, lets the flags the
// user set (in parsed) override it, and validates the result.
func loadServeConfig(parsed *pflag.FlagSet, configPath string) (*config.ProxyConfiguration, error) {
	cfg := config.Default()
	if configPath != "" {
		var err error
		if cfg, err = config.Read(configPath); err != nil {
			return nil, err
		}
	}
	onto := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	sections := bindServeFlags(onto, cfg)
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
	for _, s := range sections {
		if !s.inFile && !slices.ContainsFunc(s.flags, parsed.Changed) {
			s.drop(cfg)
		}
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

// bindServeFlags binds the serve flags onto cfg's fields: the one list of
// flags, their names, help and defaults (cfg's values). As the kubelet
// does (kubeletConfigFlagPrecedence), a flag the user set overrides the
// file because it is bound again onto the decoded file and set there.
// The optional sections' flags are bound onto sections allocated for
// them; it returns those sections, for the loader to drop the ones neither
// the file nor a flag set.
func bindServeFlags(fs *pflag.FlagSet, cfg *config.ProxyConfiguration) []boundSection {
	fs.StringVar(&cfg.Socket.Path, "socket", cfg.Socket.Path, "unix socket to serve CRI on")
	fs.StringVar(&cfg.Socket.Group, "socket-group", cfg.Socket.Group, "group that may use the socket (mode 0660), a name or a GID")
	fs.StringVar(&cfg.RuntimeEndpoint, "runtime-endpoint", cfg.RuntimeEndpoint, "the container runtime's CRI endpoint")
	fs.StringVar(&cfg.ImageEndpoint, "image-endpoint", cfg.ImageEndpoint, "a separate CRI image service endpoint, as the kubelet's --image-service-endpoint")
	fs.StringVar(&cfg.Monitoring.Address, "monitoring-address", cfg.Monitoring.Address, "host:port for /metrics, /healthz and /readyz; - turns it off")
	fs.BoolVar(&cfg.Monitoring.Profiling, "profiling", cfg.Monitoring.Profiling, "serve Go's pprof handlers under /debug/pprof/ on the monitoring address")
	fs.DurationVar(&cfg.ShutdownTimeout.Duration, "shutdown-timeout", cfg.ShutdownTimeout.Duration, "how long calls in flight may finish after SIGTERM")
	fs.StringVar(&cfg.Logging.Level, "log-level", cfg.Logging.Level, "debug, info, warn or error; debug logs every CRI call (never its content)")
	fs.StringVar(&cfg.Logging.Format, "log-format", cfg.Logging.Format, "text or json")
	e := &cfg.EnsureSecretPulledImages
	fs.BoolVar(&e.Enabled, "ensure-secret-pulled-images", e.Enabled, "enforce KEP-2535: an image pulled with credentials goes only to pods whose credentials were verified for it")
	fs.StringVar(&e.ImagePullCredentialsVerificationPolicy, "image-pull-credentials-verification-policy", e.ImagePullCredentialsVerificationPolicy, "the kubelet's policy, one of:\n"+decision.PolicyHelp())
	fs.StringVar(&e.DatabasePath, "ensure-database", e.DatabasePath, "the records database (bbolt)")
	fs.StringVar(&e.AdminSocket, "admin-socket", e.AdminSocket, "the records admin socket (root, and --admin-group)")
	fs.StringVar(&e.AdminGroup, "admin-group", e.AdminGroup, "group that may use the records admin socket besides root, a name or a GID (checked on each caller's credentials)")
	fs.Var(superseding{&cfg.RegistryCheck.HostsDir, &e.RegistryHostsDir}, "registry-hosts-dir", "where the node's containerd reads its registries' hosts.toml (its config_path): the registry check asks each image's own registry as it finds it there, never a mirror")
	fs.StringVar(&cfg.RegistryCheck.RegistriesConf, "registries-conf", cfg.RegistryCheck.RegistriesConf, "on a CRI-O node, its containers-registries.conf (/etc/containers/registries.conf; drop-ins in the .d directory beside it): the registry check reads it instead of --registry-hosts-dir, and asks each image's own registry, never a mirror")
	var bound []boundSection
	for _, s := range optionalSections {
		bound = append(bound, s.bind(fs, cfg))
	}
	return bound
}

// optionalSections are the configuration's optional sections that have
// flags. A section is present when the file has it or one of its flags is
// set; otherwise it stays absent (nil), and what it turns on stays off.
// A new optional section with flags is one entry here.
var optionalSections = []optionalSection{
	section[config.CredentialProviders]{
		field: func(c *config.ProxyConfiguration) **config.CredentialProviders { return &c.CredentialProviders },
		flags: func(fs *pflag.FlagSet, cp *config.CredentialProviders) {
			fs.StringVar(&cp.Config, "image-credential-provider-config", cp.Config, "the kubelet's CredentialProviderConfig (file or directory): inject its plugins' credentials into pulls without any")
			fs.StringVar(&cp.BinDir, "image-credential-provider-bin-dir", cp.BinDir, "the directory of the credential provider plugin executables")
		},
	},
	section[config.ImagePolicy]{
		field: func(c *config.ProxyConfiguration) **config.ImagePolicy { return &c.ImagePolicy },
		flags: func(fs *pflag.FlagSet, ip *config.ImagePolicy) {
			fs.StringVar(&ip.Config, "image-policy-config", ip.Config, "an ImagePolicyConfig (file or directory): image policy plugins allow or refuse images per namespace at pull and at container create")
			fs.StringVar(&ip.BinDir, "image-policy-bin-dir", ip.BinDir, "the directory of the image policy plugin executables")
		},
	},
	section[config.Kubernetes]{
		field: func(c *config.ProxyConfiguration) **config.Kubernetes { return &c.Kubernetes },
		flags: func(fs *pflag.FlagSet, k *config.Kubernetes) {
			fs.StringVar(&k.Kubeconfig, "kubeconfig", k.Kubeconfig, "kubeconfig for the Kubernetes API (service-account token providers, pod-aware ensure decisions); its user may be an exec plugin")
			fs.StringVar(&k.NodeName, "node-name", k.NodeName, "this node's name in the Kubernetes API (default: the host name)")
		},
	},
	section[config.SecureMonitoring]{
		field: func(c *config.ProxyConfiguration) **config.SecureMonitoring { return &c.Monitoring.Secure },
		flags: func(fs *pflag.FlagSet, sm *config.SecureMonitoring) {
			fs.StringVar(&sm.Address, "secure-monitoring-address", sm.Address, "host:port for /metrics over TLS, for callers the API authorizes to get nodes/metrics (needs --kubeconfig)")
			fs.StringVar(&sm.CertFile, "tls-cert-file", sm.CertFile, "the TLS certificate of the secure monitoring address (default: self-signed)")
			fs.StringVar(&sm.KeyFile, "tls-private-key-file", sm.KeyFile, "the TLS key of the secure monitoring address")
		},
	},
}

// optionalSection is an entry of optionalSections.
type optionalSection interface {
	bind(fs *pflag.FlagSet, cfg *config.ProxyConfiguration) boundSection
}

// section is an optional section of type T: field points at it in a
// configuration, flags binds its flags onto it.
type section[T any] struct {
	field func(*config.ProxyConfiguration) **T
	flags func(*pflag.FlagSet, *T)
}

// bind binds the section's flags onto cfg's section, allocated if cfg has
// none.
func (s section[T]) bind(fs *pflag.FlagSet, cfg *config.ProxyConfiguration) boundSection {
	p := s.field(cfg)
	b := boundSection{inFile: *p != nil, drop: func(c *config.ProxyConfiguration) { *s.field(c) = nil }}
	if *p == nil {
		*p = new(T)
	}
	own := pflag.NewFlagSet("", pflag.ContinueOnError)
	s.flags(own, *p)
	own.VisitAll(func(f *pflag.Flag) {
		fs.AddFlag(f)
		b.flags = append(b.flags, f.Name)
	})
	return b
}

// boundSection is an optional section whose flags were bound.
type boundSection struct {
	inFile bool     // the configuration had it before its flags were bound
	flags  []string // its flags' names
	drop   func(*config.ProxyConfiguration)
}

// superseding is a string flag bound to a field that superseded a
// deprecated one: setting it sets the field and clears the deprecated one,
// which the file may have set, as a flag overrides the file wherever the
// file put the setting.
type superseding struct{ field, deprecated *string }

func (s superseding) Set(v string) error {
	*s.field, *s.deprecated = v, ""
	return nil
}

func (s superseding) String() string { return *s.field }
func (s superseding) Type() string   { return "string" }
