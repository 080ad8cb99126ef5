package config

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

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
	errs = append(errs, decision.ValidatePolicy(p, decision.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)...)
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
	r := &c.RegistryCheck
	errs, hostsDir, mirrors := deprecatedRegistryFields(r, &c.EnsureSecretPulledImages)
	p := field.NewPath("registryCheck")
	errs = append(errs, validateRegistryPaths(p, r, hostsDir)...)
	errs = append(errs, validateProofBounds(p, r)...)
	return append(errs, validateVouched(r, mirrors)...)
}

// deprecatedRegistryFields checks the deprecated fields against their
// successors, and returns the paths the values came from.
func deprecatedRegistryFields(r *RegistryCheck, e *EnsureSecretPulledImages) (errs field.ErrorList, hostsDir, mirrors *field.Path) {
	hostsDir, mirrors = registryHostsDir, registryVouchedMirrors
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
	return errs, hostsDir, mirrors
}

// validateRegistryPaths checks the hosts directories, registries.conf and
// its certificates' directories.
func validateRegistryPaths(p *field.Path, r *RegistryCheck, hostsDir *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, d := range filepath.SplitList(r.HostsDir) {
		if !filepath.IsAbs(d) {
			errs = append(errs, field.Invalid(hostsDir, r.HostsDir, "must be absolute paths, separated by colons"))
			break
		}
	}
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
	return errs
}

// validateProofBounds checks the timeouts and the layer proofs' bounds.
func validateProofBounds(p *field.Path, r *RegistryCheck) field.ErrorList {
	var errs field.ErrorList
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
	return errs
}

// validateVouched checks each vouched-for mirror (its endpoint redacted in
// the error), then the list as a whole.
func validateVouched(r *RegistryCheck, mirrors *field.Path) field.ErrorList {
	var errs field.ErrorList
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
