package config

import (
	"log/slog"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// The type this package decodes.
const (
	APIVersion = "config.cri-image-proxy.io/v1alpha1"
	Kind       = "ProxyConfiguration"
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
func (e *EnsureSecretPulledImages) Expiry() *decision.Expiry {
	if e.MaxRecordAge.Duration == 0 && len(e.MaxRecordAgeByRepository) == 0 {
		return nil
	}
	x := &decision.Expiry{Default: e.MaxRecordAge.Duration}
	for _, r := range e.MaxRecordAgeByRepository {
		x.ByRepository = append(x.ByRepository, decision.RepositoryAge{Pattern: r.Pattern, MaxAge: r.MaxAge.Duration})
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

// SlogLevel returns the level as a slog.Level.
func (l Logging) SlogLevel() (slog.Level, error) {
	var lvl slog.Level
	err := lvl.UnmarshalText([]byte(l.Level))
	return lvl, err
}
