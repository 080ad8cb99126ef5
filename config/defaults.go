package config

import (
	"os"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cri-image-proxy/cri-image-proxy/registry"
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

// Default returns a configuration with every default filled in.
func Default() *ProxyConfiguration {
	c := &ProxyConfiguration{APIVersion: APIVersion, Kind: Kind}
	c.SetDefaults()
	return c
}

// SetDefaults fills the fields left empty, section by section.
func (c *ProxyConfiguration) SetDefaults() {
	c.setServingDefaults()
	c.EnsureSecretPulledImages.setDefaults()
	c.setRegistryCheckDefaults()
	if k := c.Kubernetes; k != nil {
		k.setDefaults()
	}
	if ip := c.ImagePolicy; ip != nil {
		ip.setDefaults()
	}
	if cp := c.CredentialProviders; cp != nil {
		cp.setDefaults()
	}
}

// setServingDefaults fills the socket, the runtime, monitoring, shutdown
// and logging.
func (c *ProxyConfiguration) setServingDefaults() {
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
}

func (e *EnsureSecretPulledImages) setDefaults() {
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
}

// setRegistryCheckDefaults fills the registry check's section; a
// deprecated field of ensureSecretPulledImages set alone is its
// successor's value.
func (c *ProxyConfiguration) setRegistryCheckDefaults() {
	r, e := &c.RegistryCheck, &c.EnsureSecretPulledImages
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
}

func (k *Kubernetes) setDefaults() {
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

func (ip *ImagePolicy) setDefaults() {
	if ip.CacheSize == 0 {
		ip.CacheSize = DefaultPluginCacheSize
	}
	if ip.CachePurgeInterval.Duration == 0 {
		ip.CachePurgeInterval.Duration = DefaultPluginCachePurgeInterval
	}
}

func (cp *CredentialProviders) setDefaults() {
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
