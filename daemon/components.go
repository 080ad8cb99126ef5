package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

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

// newImagePolicy loads the image policy configuration and builds the
// engine that runs its plugins.
func newImagePolicy(ip *config.ImagePolicy, log *slog.Logger, reg prometheus.Registerer) (*imagepolicy.Engine, error) {
	pc, err := imagepolicy.LoadConfig(ip.Config, ip.BinDir)
	if err != nil {
		return nil, err
	}
	return imagepolicy.New(pc, imagepolicy.Options{CacheSize: ip.CacheSize, Logger: log, Registerer: reg})
}

// newRegistryCheck is the registry check ensure and the image policy ask
// registries through: one, whichever of them is on, its metrics
// registered once.
func newRegistryCheck(rc config.RegistryCheck, log *slog.Logger, reg prometheus.Registerer) (*registry.Checker, error) {
	checker, err := registry.New(registry.Options{
		HostsDir:                  rc.HostsDir,
		RegistriesConf:            rc.RegistriesConf,
		CertsDir:                  rc.CertsDir,
		Vouched:                   rc.Vouched(),
		Timeout:                   rc.Timeout.Duration,
		ProofTimeout:              rc.ProofTimeout.Duration,
		MaxProofBytes:             rc.MaxProofBytes.Value(),
		MaxProofUncompressedBytes: rc.MaxProofUncompressedBytes.Value(),
		MaxProofParallel:          rc.MaxProofParallel,
		Registerer:                reg,
		Logger:                    log,
	})
	if err != nil {
		return nil, fmt.Errorf("registryCheck: %w", err)
	}
	source := []any{"hostsDir", rc.HostsDir}
	if rc.RegistriesConf != "" {
		source = []any{"registriesConf", rc.RegistriesConf, "certsDir", rc.CertsDir}
	}
	log.Info("registry check on", append(source, "vouchedMirrors", len(rc.VouchedMirrors), "timeout", rc.Timeout.Duration,
		"proofTimeout", rc.ProofTimeout.Duration, "maxProofBytes", rc.MaxProofBytes.String(),
		"maxProofUncompressedBytes", rc.MaxProofUncompressedBytes.String(), "maxProofParallel", rc.MaxProofParallel)...)
	return checker, nil
}

// logImagePolicy says, at the start and at each reload, what the operator
// controls beyond the providers' names: the files whose change drops each
// provider's verdicts, and the namespaces' no-match policies.
func logImagePolicy(log *slog.Logger, pc *imagepolicy.Config) {
	for _, p := range pc.Providers {
		from := "watchFiles"
		if p.WatchFilesFromArgs {
			from = "args"
		}
		log.Info("image policy provider", "provider", p.Name, "namespaces", p.Namespaces, "matchImages", p.MatchImages,
			"watchFiles", p.WatchFiles, "watchFilesFrom", from)
	}
	log.Info("image policy noMatchPolicy", "default", pc.NoMatch.DefaultPolicy(), "namespaces", pc.NoMatch.Namespaces)
}

// newIdentity connects to the Kubernetes API and starts the node's pod
// informer (waiting a little for it: without it, pods are read with GETs).
func newIdentity(ctx context.Context, k *config.Kubernetes, version string, log *slog.Logger, reg prometheus.Registerer) (*podtoken.Source, *rest.Config, error) {
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
