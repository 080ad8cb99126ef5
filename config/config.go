package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// The type this package decodes.
const (
	APIVersion = "config.cri-image-proxy.io/v1alpha1"
	Kind       = "ProxyConfiguration"
)

// Defaults.
const (
	DefaultSocketPath        = "/run/cri-image-proxy/cri-image-proxy.sock"
	DefaultRuntimeEndpoint   = "unix:///run/containerd/containerd.sock"
	DefaultMonitoringAddress = "127.0.0.1:9741"
	DefaultShutdownTimeout   = 30 * time.Second

	DefaultEnsureDatabase    = "/var/lib/cri-image-proxy/ensure.db"
	DefaultEnsurePolicy      = "NeverVerifyPreloadedImages"
	DefaultEnsureGCInterval  = 5 * time.Minute
	DefaultEnsureGracePeriod = 10 * time.Minute
	DefaultAdminSocket       = "/run/cri-image-proxy/admin.sock"

	DefaultPluginExecTimeout        = time.Minute
	DefaultPluginCacheSize          = 4096
	DefaultPluginCachePurgeInterval = time.Minute
)

// ProxyConfiguration configures cri-image-proxy serve.
type ProxyConfiguration struct {
	// APIVersion is config.cri-image-proxy.io/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind is ProxyConfiguration.
	Kind string `json:"kind"`

	// Socket is where the proxy serves CRI: the kubelet's
	// --container-runtime-endpoint and crictl point here.
	Socket Socket `json:"socket"`
	// RuntimeEndpoint is the runtime the proxy forwards to, as unix:///path.
	// Default: unix:///run/containerd/containerd.sock.
	RuntimeEndpoint string `json:"runtimeEndpoint,omitempty"`
	// ImageEndpoint, when set, serves the ImageService instead of
	// RuntimeEndpoint, like the kubelet's --image-service-endpoint.
	ImageEndpoint string `json:"imageEndpoint,omitempty"`
	// Monitoring serves /metrics, /healthz and /readyz.
	Monitoring Monitoring `json:"monitoring"`
	// ShutdownTimeout bounds how long calls in flight (a long PullImage) may
	// run after SIGTERM or SIGINT before they are cancelled. Default: 30s.
	ShutdownTimeout metav1.Duration `json:"shutdownTimeout"`
	// Logging configures the daemon's logs.
	Logging Logging `json:"logging"`
	// CredentialProviders completes pulls that carry no credentials with
	// credentials from the kubelet's credential provider exec plugins
	// (KEP-2133). Absent: pulls are forwarded as they come.
	CredentialProviders *CredentialProviders `json:"credentialProviders,omitempty"`
	// EnsureSecretPulledImages enforces KEP-2535 at the CRI layer: an image
	// pulled with credentials is handed only to pods whose credentials were
	// verified for it.
	EnsureSecretPulledImages EnsureSecretPulledImages `json:"ensureSecretPulledImages"`
	// RegistryCheck is how the proxy asks an image's own registry for its
	// word: ensure's verification of a pull's credential, and the digest
	// the image policy decides on, whichever of the two is on.
	RegistryCheck RegistryCheck `json:"registryCheck"`
	// Kubernetes gives the proxy the Kubernetes API, which service-account
	// token providers (KEP-4412) need, and with which ensure decisions see
	// pods' service accounts and pull secrets. Absent: no API.
	Kubernetes *Kubernetes `json:"kubernetes,omitempty"`
	// ImagePolicy runs image policy plugins: an image is allowed for
	// a pod's namespace at PullImage, on the digest its registry resolved,
	// and at CreateContainer, for the image and every image volume.
	// Absent: no image policy.
	ImagePolicy *ImagePolicy `json:"imagePolicy,omitempty"`
}

// ImagePolicy configures image policy plugins.
type ImagePolicy struct {
	// Config is the ImagePolicyConfig, a file or a directory of files,
	// reloaded when it changes.
	Config string `json:"config"`
	// BinDir holds the plugin executables.
	BinDir string `json:"binDir"`
	// CacheSize bounds the cached verdicts per provider. Default: 4096.
	CacheSize int `json:"cacheSize,omitempty"`
	// CachePurgeInterval is how often expired verdicts are dropped from
	// memory. Default: 1m.
	CachePurgeInterval metav1.Duration `json:"cachePurgeInterval,omitempty"`
}

// Kubernetes is how the proxy reaches the API server.
type Kubernetes struct {
	// Kubeconfig is the kubeconfig file (its user may be an exec credential
	// plugin, KEP-541). Empty: the in-cluster configuration (a DaemonSet).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// NodeName is this node's name in the API. Default: the host name.
	NodeName string `json:"nodeName,omitempty"`
	// QPS and Burst bound the client's request rate. Service-account token
	// providers read the pod's account live on every pull, as the kubelet
	// does, so the defaults are the kubelet's (kubeAPIQPS 50, kubeAPIBurst
	// 100), not client-go's 5 and 10.
	QPS   float32 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
}

// The Kubernetes client's default rate limits: the kubelet's.
const (
	DefaultKubernetesQPS   = 50
	DefaultKubernetesBurst = 100
)

// EnsureSecretPulledImages configures KEP-2535 enforcement.
type EnsureSecretPulledImages struct {
	// Enabled turns enforcement on. Default: false.
	Enabled bool `json:"enabled"`
	// DatabasePath is the bbolt file of records (mode 0600). Default:
	// /var/lib/cri-image-proxy/ensure.db.
	DatabasePath string `json:"databasePath,omitempty"`
	// ImagePullCredentialsVerificationPolicy is the kubelet's setting of the
	// same name: NeverVerify, NeverVerifyPreloadedImages (default),
	// NeverVerifyAllowlistedImages or AlwaysVerify.
	ImagePullCredentialsVerificationPolicy string `json:"imagePullCredentialsVerificationPolicy,omitempty"`
	// PreloadedImagesVerificationAllowlist is the kubelet's setting of the
	// same name, for NeverVerifyAllowlistedImages: normalized repositories,
	// or prefixes ending in "/*".
	PreloadedImagesVerificationAllowlist []string `json:"preloadedImagesVerificationAllowlist,omitempty"`
	// GCInterval is how often records of images the runtime no longer
	// lists, and grants of pods it no longer runs, are dropped. Default: 5m.
	GCInterval metav1.Duration `json:"gcInterval,omitempty"`
	// GracePeriod keeps such records and grants this long after their last
	// update. Default: 10m.
	GracePeriod metav1.Duration `json:"gracePeriod,omitempty"`
	// AdminSocket serves the records API for cri-image-proxy records
	// (mode 0600: root only). Default: /run/cri-image-proxy/admin.sock.
	AdminSocket string `json:"adminSocket,omitempty"`
	// AdminGroup, a name or a GID, may use the admin socket as well as
	// root (the socket is then mode 0660, of that group). Empty: root only.
	// The daemon checks every caller's uid and groups on the socket itself,
	// so this holds whatever the file's mode (systemd's, under socket
	// activation).
	AdminGroup string `json:"adminGroup,omitempty"`
	// MaxRecordAge, when set, is how long a verified credential is re-used
	// before it must be verified again against the registry (the KEP's
	// dropped recheck period): an IfNotPresent pod then pulls, a Never
	// pod is refused until one has. Default: 0, records never expire (the
	// kubelet's behaviour).
	MaxRecordAge metav1.Duration `json:"maxRecordAge,omitempty"`
	// MaxRecordAgeByRepository overrides MaxRecordAge for repositories
	// matching a pattern (the kubelet's matchImages syntax); the first
	// match wins.
	MaxRecordAgeByRepository []RepositoryMaxAge `json:"maxRecordAgeByRepository,omitempty"`
	// RegistryHostsDir is deprecated: registryCheck.hostsDir. Still read:
	// it is the registry check's when that is not set, and the two set to
	// different values are an error.
	RegistryHostsDir string `json:"registryHostsDir,omitempty"`
	// VouchedMirrors is deprecated: registryCheck.vouchedMirrors, read as
	// RegistryHostsDir is.
	VouchedMirrors []VouchedMirror `json:"vouchedMirrors,omitempty"`
}

// RegistryCheck configures the registry check.
type RegistryCheck struct {
	// HostsDir is where the node's containerd reads its registries'
	// hosts.toml (its registry config_path; a colon-separated list, as
	// containerd takes it). The check asks the image's own registry, its
	// server and TLS settings read from there as the runtime reads them:
	// never a mirror listed there. Default:
	// /etc/containerd/certs.d:/etc/docker/certs.d.
	HostsDir string `json:"hostsDir,omitempty"`
	// RegistriesConf, on a CRI-O node, is the runtime's
	// containers-registries.conf (CRI-O's is
	// /etc/containers/registries.conf): the check reads it and the *.conf
	// drop-ins of the directory of the same name and ".d", instead of
	// HostsDir, as containers/image does: never a [[registry.mirror]],
	// insecure registries over plain HTTP too, blocked ones refused. Empty
	// (the default): the runtime is containerd, and HostsDir is read. The
	// files' content is read again at the next check after it changed
	// (and at a reload, which refuses a file that does not parse); the
	// path needs a restart.
	RegistriesConf string `json:"registriesConf,omitempty"`
	// CertsDir, with RegistriesConf, are containers' certs.d directories
	// (colon-separated, the first that has a <host[:port]> directory
	// wins): a registry's CA (*.crt) and client certificate (*.cert and
	// *.key), as containers/image reads them. Default, with
	// RegistriesConf: /etc/containers/certs.d:/etc/docker/certs.d.
	CertsDir string `json:"certsDir,omitempty"`
	// Timeout bounds each question a check asks a registry (the image
	// reference's resolution, a round of blob requests); past it the
	// registry is unreachable, and the pull refused. Default: 10s.
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// ProofTimeout bounds the proof of a pull's layers by their bytes
	// (layers the node holds that the pulled repository never supplied).
	// Default: 10m.
	ProofTimeout metav1.Duration `json:"proofTimeout,omitempty"`
	// MaxProofBytes bounds each layer a proof fetches, compressed: a layer
	// over it cannot be proven, and its pull is refused. Default: 8Gi.
	MaxProofBytes resource.Quantity `json:"maxProofBytes,omitempty"`
	// MaxProofUncompressedBytes bounds what each layer a proof fetches
	// decompresses to: a small blob that inflates to terabytes (a
	// decompression bomb) stops there, not at proofTimeout. A layer over
	// it cannot be proven, and its pull is refused. At least
	// maxProofBytes. Default: 4 times maxProofBytes (32Gi).
	MaxProofUncompressedBytes resource.Quantity `json:"maxProofUncompressedBytes,omitempty"`
	// MaxProofParallel bounds the layers one proof fetches at once.
	// Default: 3, containerd's for a pull's layer downloads.
	MaxProofParallel int `json:"maxProofParallel,omitempty"`
	// VouchedMirrors are mirrors the operator vouches for, for nodes that
	// reach only a mirror: one that enforces the registry's own
	// authorization (it passes each caller's credential on, or checks it as
	// the registry would). The registry check of a registry listed here asks
	// its mirror instead, and records explain says so. Reloadable.
	VouchedMirrors []VouchedMirror `json:"vouchedMirrors,omitempty"`
}

// VouchedMirror is a mirror the operator vouches for.
type VouchedMirror struct {
	// Registry is the registry host as images name it: "docker.io",
	// "registry.example:5000".
	Registry string `json:"registry"`
	// Endpoint is the mirror's URL: "https://mirror.example".
	Endpoint string `json:"endpoint"`
}

// Vouched is r's vouched-for mirrors as the registry check takes them.
func (r *RegistryCheck) Vouched() []registry.VouchedMirror {
	var out []registry.VouchedMirror
	for _, v := range r.VouchedMirrors {
		out = append(out, registry.VouchedMirror{Registry: v.Registry, Endpoint: v.Endpoint})
	}
	return out
}

// RepositoryMaxAge is the maximum record age of repositories matching
// Pattern.
type RepositoryMaxAge struct {
	Pattern string          `json:"pattern"`
	MaxAge  metav1.Duration `json:"maxAge"`
}

// Expiry is the record expiry e configures (nil for none).
func (e *EnsureSecretPulledImages) Expiry() *ensure.Expiry {
	if e.MaxRecordAge.Duration == 0 && len(e.MaxRecordAgeByRepository) == 0 {
		return nil
	}
	x := &ensure.Expiry{Default: e.MaxRecordAge.Duration}
	for _, r := range e.MaxRecordAgeByRepository {
		x.ByRepository = append(x.ByRepository, ensure.RepositoryAge{Pattern: r.Pattern, MaxAge: r.MaxAge.Duration})
	}
	return x
}

// CredentialProviders configures credential injection.
type CredentialProviders struct {
	// Config is the kubelet's CredentialProviderConfig, a file or a
	// directory of files, as --image-credential-provider-config.
	Config string `json:"config"`
	// BinDir holds the plugin executables, as
	// --image-credential-provider-bin-dir.
	BinDir string `json:"binDir"`
	// ExecTimeout bounds one plugin run; the plugin and its children are
	// killed past it. Default: 1m, the kubelet's.
	ExecTimeout metav1.Duration `json:"execTimeout,omitempty"`
	// CacheSize bounds the number of cached answers per plugin. Default: 4096.
	CacheSize int `json:"cacheSize,omitempty"`
	// CachePurgeInterval is how often expired credentials are dropped from
	// memory (the kubelet only drops them when read). Default: 1m.
	CachePurgeInterval metav1.Duration `json:"cachePurgeInterval,omitempty"`
}

// Socket is the proxy's own CRI socket.
type Socket struct {
	// Path of the socket. Default: /run/cri-image-proxy/cri-image-proxy.sock.
	Path string `json:"path,omitempty"`
	// Group that may use the socket (mode 0660), a name or a GID. Empty:
	// the daemon's own group.
	Group string `json:"group,omitempty"`
}

// Monitoring is the HTTP endpoint for metrics and health checks.
type Monitoring struct {
	// Address to listen on, host:port. Default 127.0.0.1:9741. "-" turns
	// the endpoint off.
	Address string `json:"address,omitempty"`
	// Profiling serves Go's pprof handlers under /debug/pprof/ as well.
	// Off by default: profiles reveal the process's memory.
	Profiling bool `json:"profiling,omitempty"`
	// Secure serves /metrics alone over TLS on a node address, for
	// Prometheus in the cluster, to callers whose bearer token the API
	// authorizes to get nodes/metrics of this node, as the kubelet's
	// /metrics. It needs the kubernetes section. Absent by default.
	Secure *SecureMonitoring `json:"secure,omitempty"`
}

// SecureMonitoring is the TLS /metrics endpoint.
type SecureMonitoring struct {
	// Address to listen on, host:port (a node address, or :9742 for all).
	Address string `json:"address"`
	// CertFile and KeyFile are its TLS certificate and key (PEM); both
	// empty: a self-signed certificate made at start, as the kubelet does.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
}

// Logging configures the logs, written to standard error.
type Logging struct {
	// Level is debug, info (default), warn or error. At debug every CRI call
	// is logged with its method, code and duration, never its content.
	Level string `json:"level,omitempty"`
	// Format is text (default) or json.
	Format string `json:"format,omitempty"`
}

// Default returns a configuration with every default filled in.
func Default() *ProxyConfiguration {
	c := &ProxyConfiguration{APIVersion: APIVersion, Kind: Kind}
	c.SetDefaults()
	return c
}

// SetDefaults fills the fields left empty.
func (c *ProxyConfiguration) SetDefaults() {
	if c.Socket.Path == "" {
		c.Socket.Path = DefaultSocketPath
	}
	if c.RuntimeEndpoint == "" {
		c.RuntimeEndpoint = DefaultRuntimeEndpoint
	}
	if c.Monitoring.Address == "" {
		c.Monitoring.Address = DefaultMonitoringAddress
	}
	if c.ShutdownTimeout.Duration == 0 {
		c.ShutdownTimeout.Duration = DefaultShutdownTimeout
	}
	if c.Logging.Level == "" {
		c.Logging.Level = "info"
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "text"
	}
	e := &c.EnsureSecretPulledImages
	if e.DatabasePath == "" {
		e.DatabasePath = DefaultEnsureDatabase
	}
	if e.ImagePullCredentialsVerificationPolicy == "" {
		e.ImagePullCredentialsVerificationPolicy = DefaultEnsurePolicy
	}
	if e.GCInterval.Duration == 0 {
		e.GCInterval.Duration = DefaultEnsureGCInterval
	}
	if e.GracePeriod.Duration == 0 {
		e.GracePeriod.Duration = DefaultEnsureGracePeriod
	}
	if e.AdminSocket == "" {
		e.AdminSocket = DefaultAdminSocket
	}
	// A deprecated field set alone is its successor's value.
	r := &c.RegistryCheck
	if r.HostsDir == "" {
		r.HostsDir = e.RegistryHostsDir
	}
	if r.VouchedMirrors == nil && e.VouchedMirrors != nil {
		r.VouchedMirrors = slices.Clone(e.VouchedMirrors)
	}
	if r.HostsDir == "" {
		r.HostsDir = registry.DefaultHostsDir
	}
	if r.RegistriesConf != "" && r.CertsDir == "" {
		r.CertsDir = registry.DefaultCertsDir
	}
	if r.Timeout.Duration == 0 {
		r.Timeout.Duration = registry.DefaultTimeout
	}
	if r.ProofTimeout.Duration == 0 {
		r.ProofTimeout.Duration = registry.DefaultProofTimeout
	}
	if r.MaxProofBytes.IsZero() {
		r.MaxProofBytes = *resource.NewQuantity(registry.DefaultMaxProofBytes, resource.BinarySI)
	}
	// The decompressed bound follows the compressed one the file sets (a
	// negative one is left for Validate to name).
	if r.MaxProofUncompressedBytes.IsZero() && r.MaxProofBytes.Sign() > 0 {
		r.MaxProofUncompressedBytes = *resource.NewQuantity(registry.DefaultMaxProofUncompressed(r.MaxProofBytes.Value()), resource.BinarySI)
	}
	if r.MaxProofParallel == 0 {
		r.MaxProofParallel = registry.DefaultMaxProofParallel
	}
	if k := c.Kubernetes; k != nil {
		if k.NodeName == "" {
			k.NodeName, _ = os.Hostname()
		}
		if k.QPS == 0 {
			k.QPS = DefaultKubernetesQPS
		}
		if k.Burst == 0 {
			k.Burst = DefaultKubernetesBurst
		}
	}
	if ip := c.ImagePolicy; ip != nil {
		if ip.CacheSize == 0 {
			ip.CacheSize = DefaultPluginCacheSize
		}
		if ip.CachePurgeInterval.Duration == 0 {
			ip.CachePurgeInterval.Duration = DefaultPluginCachePurgeInterval
		}
	}
	if cp := c.CredentialProviders; cp != nil {
		if cp.ExecTimeout.Duration == 0 {
			cp.ExecTimeout.Duration = DefaultPluginExecTimeout
		}
		if cp.CacheSize == 0 {
			cp.CacheSize = DefaultPluginCacheSize
		}
		if cp.CachePurgeInterval.Duration == 0 {
			cp.CachePurgeInterval.Duration = DefaultPluginCachePurgeInterval
		}
	}
}

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*ProxyConfiguration, error) {
	c, err := Read(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Read reads and decodes the file at path and fills defaults; it does not
// validate, so that flags can be applied first.
func Read(path string) (*ProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Decode decodes YAML or JSON strictly and fills defaults; it does not
// validate, so that flags can be applied first.
func Decode(data []byte) (*ProxyConfiguration, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	c := &ProxyConfiguration{}
	// sigs.k8s.io/json names the full path of an unknown field, as
	// Kubernetes component configs do ("socket.pth").
	strictErrs, err := kjson.UnmarshalStrict(js, c, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, err
	}
	if len(strictErrs) > 0 {
		return nil, errors.Join(strictErrs...)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("apiVersion/kind is %q/%q, want %q/%q", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	c.SetDefaults()
	return c, nil
}

// Validate reports every problem at once, each with its field path.
func (c *ProxyConfiguration) Validate() error {
	var errs field.ErrorList
	if !filepath.IsAbs(c.Socket.Path) {
		errs = append(errs, field.Invalid(field.NewPath("socket", "path"), c.Socket.Path, "must be an absolute path"))
	} else if len(c.Socket.Path) > 107 {
		errs = append(errs, field.TooLong(field.NewPath("socket", "path"), c.Socket.Path, 107))
	}
	errs = append(errs, validateEndpoint(field.NewPath("runtimeEndpoint"), c.RuntimeEndpoint, true)...)
	errs = append(errs, validateEndpoint(field.NewPath("imageEndpoint"), c.ImageEndpoint, false)...)
	if c.Socket.Path != "" && (c.RuntimeEndpoint == "unix://"+c.Socket.Path || c.ImageEndpoint == "unix://"+c.Socket.Path) {
		errs = append(errs, field.Invalid(field.NewPath("socket", "path"), c.Socket.Path, "is the runtime endpoint: the proxy would forward to itself"))
	}
	if a := c.Monitoring.Address; a != "-" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("monitoring", "address"), a, "must be host:port, or - to turn it off"))
		}
	}
	if sm := c.Monitoring.Secure; sm != nil {
		p := field.NewPath("monitoring", "secure")
		if _, _, err := net.SplitHostPort(sm.Address); err != nil {
			errs = append(errs, field.Invalid(p.Child("address"), sm.Address, "must be host:port"))
		}
		if (sm.CertFile == "") != (sm.KeyFile == "") {
			errs = append(errs, field.Invalid(p.Child("keyFile"), sm.KeyFile, "certFile and keyFile go together (both empty: a self-signed certificate)"))
		}
		if c.Kubernetes == nil {
			errs = append(errs, field.Required(field.NewPath("kubernetes"), "monitoring.secure authorizes its callers through the API"))
		}
	}
	if c.ShutdownTimeout.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("shutdownTimeout"), c.ShutdownTimeout.Duration.String(), "must not be negative"))
	}
	if _, err := c.Logging.SlogLevel(); err != nil {
		errs = append(errs, field.NotSupported(field.NewPath("logging", "level"), c.Logging.Level, []string{"debug", "info", "warn", "error"}))
	}
	if f := c.Logging.Format; f != "text" && f != "json" {
		errs = append(errs, field.NotSupported(field.NewPath("logging", "format"), f, []string{"text", "json"}))
	}
	if cp := c.CredentialProviders; cp != nil {
		p := field.NewPath("credentialProviders")
		errs = append(errs, validatePlugins(p, cp.Config, cp.BinDir, cp.CacheSize, cp.CachePurgeInterval.Duration)...)
		if cp.ExecTimeout.Duration < 0 {
			errs = append(errs, field.Invalid(p.Child("execTimeout"), cp.ExecTimeout.Duration.String(), "must not be negative"))
		}
	}
	if ip := c.ImagePolicy; ip != nil {
		errs = append(errs, validatePlugins(field.NewPath("imagePolicy"), ip.Config, ip.BinDir, ip.CacheSize, ip.CachePurgeInterval.Duration)...)
	}
	errs = append(errs, validateEnsure(field.NewPath("ensureSecretPulledImages"), &c.EnsureSecretPulledImages)...)
	errs = append(errs, validateRegistryCheck(c)...)
	if k := c.Kubernetes; k != nil {
		if k.Kubeconfig != "" && !filepath.IsAbs(k.Kubeconfig) {
			errs = append(errs, field.Invalid(field.NewPath("kubernetes", "kubeconfig"), k.Kubeconfig, "must be an absolute path"))
		}
		if k.NodeName == "" {
			errs = append(errs, field.Required(field.NewPath("kubernetes", "nodeName"), "this node's name in the API"))
		}
		if k.QPS < 0 {
			errs = append(errs, field.Invalid(field.NewPath("kubernetes", "qps"), k.QPS, "must not be negative"))
		}
		if k.Burst < 0 {
			errs = append(errs, field.Invalid(field.NewPath("kubernetes", "burst"), k.Burst, "must not be negative"))
		}
	}
	return errs.ToAggregate()
}

// validatePlugins checks what the plugin sections share: the plugins'
// configuration and directory, absolute paths, and their cache's bounds.
func validatePlugins(p *field.Path, config, binDir string, cacheSize int, purge time.Duration) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct{ name, path string }{{"config", config}, {"binDir", binDir}} {
		if f.path == "" {
			errs = append(errs, field.Required(p.Child(f.name), "an absolute path"))
		} else if !filepath.IsAbs(f.path) {
			errs = append(errs, field.Invalid(p.Child(f.name), f.path, "must be an absolute path"))
		}
	}
	if cacheSize < 0 {
		errs = append(errs, field.Invalid(p.Child("cacheSize"), cacheSize, "must not be negative"))
	}
	if purge < 0 {
		errs = append(errs, field.Invalid(p.Child("cachePurgeInterval"), purge.String(), "must not be negative"))
	}
	return errs
}

func validateEnsure(p *field.Path, e *EnsureSecretPulledImages) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct{ name, path string }{{"databasePath", e.DatabasePath}, {"adminSocket", e.AdminSocket}} {
		if !filepath.IsAbs(f.path) {
			errs = append(errs, field.Invalid(p.Child(f.name), f.path, "must be an absolute path"))
		}
	}
	errs = append(errs, ensure.ValidatePolicy(p, ensure.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)...)
	if e.GCInterval.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("gcInterval"), e.GCInterval.Duration.String(), "must not be negative"))
	}
	if e.GracePeriod.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("gracePeriod"), e.GracePeriod.Duration.String(), "must not be negative"))
	}
	if x := e.Expiry(); x != nil {
		errs = append(errs, x.Validate(p)...)
	}
	return errs
}

// The deprecated fields, and their successors.
var (
	deprecatedHostsDir       = field.NewPath("ensureSecretPulledImages", "registryHostsDir")
	deprecatedVouchedMirrors = field.NewPath("ensureSecretPulledImages", "vouchedMirrors")
	registryHostsDir         = field.NewPath("registryCheck", "hostsDir")
	registryVouchedMirrors   = field.NewPath("registryCheck", "vouchedMirrors")
)

// validateRegistryCheck checks the registry check's section, each problem
// named where the file gave the value: a deprecated field that agrees with
// its successor (SetDefaults made the successor its copy) is that field;
// one that does not is an error naming both.
func validateRegistryCheck(c *ProxyConfiguration) field.ErrorList {
	var errs field.ErrorList
	r, e := &c.RegistryCheck, &c.EnsureSecretPulledImages
	hostsDir, mirrors := registryHostsDir, registryVouchedMirrors
	if e.RegistryHostsDir != "" {
		if e.RegistryHostsDir != r.HostsDir {
			errs = append(errs, field.Invalid(deprecatedHostsDir, e.RegistryHostsDir,
				fmt.Sprintf("deprecated, and %s is set to another value, %q: keep %s alone", registryHostsDir, r.HostsDir, registryHostsDir)))
		} else {
			hostsDir = deprecatedHostsDir
		}
	}
	if e.VouchedMirrors != nil {
		if !slices.Equal(e.VouchedMirrors, r.VouchedMirrors) {
			// Counted, not shown: an endpoint may hold a password.
			errs = append(errs, field.Invalid(deprecatedVouchedMirrors, len(e.VouchedMirrors),
				fmt.Sprintf("deprecated, and %s is set to another list (of %d): keep %s alone", registryVouchedMirrors, len(r.VouchedMirrors), registryVouchedMirrors)))
		} else {
			mirrors = deprecatedVouchedMirrors
		}
	}
	for _, d := range filepath.SplitList(r.HostsDir) {
		if !filepath.IsAbs(d) {
			errs = append(errs, field.Invalid(hostsDir, r.HostsDir, "must be absolute paths, separated by colons"))
			break
		}
	}
	p := field.NewPath("registryCheck")
	if rc := r.RegistriesConf; rc != "" && !filepath.IsAbs(rc) {
		errs = append(errs, field.Invalid(p.Child("registriesConf"), rc, "must be an absolute path"))
	}
	if r.CertsDir != "" {
		if r.RegistriesConf == "" {
			errs = append(errs, field.Invalid(p.Child("certsDir"), r.CertsDir, "is read only with registriesConf (a CRI-O node); containerd's TLS settings are in hostsDir"))
		}
		for _, d := range filepath.SplitList(r.CertsDir) {
			if !filepath.IsAbs(d) {
				errs = append(errs, field.Invalid(p.Child("certsDir"), r.CertsDir, "must be absolute paths, separated by colons"))
				break
			}
		}
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"timeout", r.Timeout.Duration}, {"proofTimeout", r.ProofTimeout.Duration}} {
		if d.d < 0 {
			errs = append(errs, field.Invalid(p.Child(d.name), d.d.String(), "must not be negative"))
		}
	}
	if r.MaxProofBytes.Sign() < 0 {
		errs = append(errs, field.Invalid(p.Child("maxProofBytes"), r.MaxProofBytes.String(), "must not be negative"))
	}
	switch {
	case r.MaxProofUncompressedBytes.Sign() < 0:
		errs = append(errs, field.Invalid(p.Child("maxProofUncompressedBytes"), r.MaxProofUncompressedBytes.String(), "must not be negative"))
	case r.MaxProofUncompressedBytes.Sign() > 0 && r.MaxProofUncompressedBytes.Cmp(r.MaxProofBytes) < 0:
		// A layer decompresses to about its size at least (incompressible
		// content): a lower bound refuses every layer between the two, a
		// mistake of units more likely than a wish.
		errs = append(errs, field.Invalid(p.Child("maxProofUncompressedBytes"), r.MaxProofUncompressedBytes.String(),
			fmt.Sprintf("must be at least maxProofBytes (%s): a layer decompresses to about its compressed size at least", r.MaxProofBytes.String())))
	}
	if r.MaxProofParallel < 0 {
		errs = append(errs, field.Invalid(p.Child("maxProofParallel"), r.MaxProofParallel, "must not be negative"))
	}
	entriesValid := true
	for i, v := range r.VouchedMirrors {
		if err := registry.ValidateVouched([]registry.VouchedMirror{{Registry: v.Registry, Endpoint: v.Endpoint}}); err != nil {
			shown := VouchedMirror{Registry: v.Registry, Endpoint: registry.RedactURL(v.Endpoint)}
			errs = append(errs, field.Invalid(mirrors.Index(i), shown, err.Error()))
			entriesValid = false
		}
	}
	// Each entry may be valid and the list not: one registry named twice
	// (docker.io and index.docker.io are one).
	if entriesValid {
		if err := registry.ValidateVouched(r.Vouched()); err != nil {
			errs = append(errs, field.Invalid(mirrors, len(r.VouchedMirrors), err.Error()))
		}
	}
	return errs
}

// Deprecation is a deprecated field a configuration sets, and the field
// that replaces it.
type Deprecation struct {
	Field, Use string
}

func (d Deprecation) String() string {
	return fmt.Sprintf("%s is deprecated: use %s (the old field is still read)", d.Field, d.Use)
}

// Deprecations are the deprecated fields c sets, for a warning: a file
// that sets one keeps working.
func (c *ProxyConfiguration) Deprecations() []Deprecation {
	var out []Deprecation
	if c.EnsureSecretPulledImages.RegistryHostsDir != "" {
		out = append(out, Deprecation{deprecatedHostsDir.String(), registryHostsDir.String()})
	}
	if c.EnsureSecretPulledImages.VouchedMirrors != nil {
		out = append(out, Deprecation{deprecatedVouchedMirrors.String(), registryVouchedMirrors.String()})
	}
	return out
}

// DropDeprecated clears the deprecated fields of a valid configuration,
// whose values SetDefaults gave their successors: what is left says the
// same in the current fields.
func (c *ProxyConfiguration) DropDeprecated() {
	c.EnsureSecretPulledImages.RegistryHostsDir = ""
	c.EnsureSecretPulledImages.VouchedMirrors = nil
}

// validateEndpoint checks a unix:///path endpoint; only the runtime
// endpoint is required.
func validateEndpoint(p *field.Path, endpoint string, required bool) field.ErrorList {
	if endpoint == "" {
		if required {
			return field.ErrorList{field.Required(p, "the runtime's CRI socket, as unix:///path")}
		}
		return nil
	}
	if _, err := criproxy.ParseEndpoint(endpoint); err != nil {
		return field.ErrorList{field.Invalid(p, endpoint, err.Error())}
	}
	return nil
}

// SlogLevel returns the level as a slog.Level.
func (l Logging) SlogLevel() (slog.Level, error) {
	var lvl slog.Level
	err := lvl.UnmarshalText([]byte(l.Level))
	return lvl, err
}
