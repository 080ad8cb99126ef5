package credplugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullreport"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// Options configure an Injector. The zero value is usable.
type Options struct {
	// ExecTimeout bounds one plugin run; 0 means DefaultExecTimeout (1m).
	ExecTimeout time.Duration
	// CacheSize bounds each provider's cache; 0 means authcache's default.
	CacheSize int
	// Clock drives the caches; nil means the real clock.
	Clock clock.WithTicker
	// Logger receives plugin diagnostics; nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
	// Identity reaches the Kubernetes API for token providers
	// (tokenAttributes); New fails without it when one is configured.
	Identity Identity
}

// Injector completes pulls that carry no credentials with credentials from
// the configured plugins. It is safe for concurrent use.
type Injector struct {
	plugins []*plugin
	metrics *metrics
	log     *slog.Logger
	config  *Config
}

// New returns an Injector for a loaded configuration.
func New(cfg *Config, opts Options) (*Injector, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	in := &Injector{log: log, config: cfg}
	var names []string
	for _, pc := range cfg.Providers {
		names = append(names, pc.Name)
	}
	byName := map[string]*plugin{}
	var err error
	in.metrics, err = newMetrics(opts.Registerer, cfg.Hash, func(name string) func() float64 {
		return func() float64 { return float64(byName[name].cache.Len()) }
	}, names)
	if err != nil {
		return nil, err
	}
	for _, pc := range cfg.Providers {
		if pc.TokenAttributes != nil && opts.Identity == nil {
			return nil, fmt.Errorf("credential provider %s (%s) uses service account tokens (tokenAttributes): the proxy needs the Kubernetes API (kubernetes.kubeconfig, or in-cluster)", pc.Name, pc.File)
		}
		name := pc.Name
		p := &plugin{
			cfg:      pc,
			identity: opts.Identity,
			runner:   newExecPlugin(pc, cfg.BinDir, opts.ExecTimeout),
			metrics:  in.metrics,
			log:      log,
			now:      clk.Now,
			cache: authcache.New[Answer](authcache.Options{Clock: clk, MaxEntries: opts.CacheSize, OnEvict: func(n int) {
				in.metrics.evictions.WithLabelValues(name).Add(float64(n))
			}}),
		}
		byName[name] = p
		in.plugins = append(in.plugins, p)
	}
	return in, nil
}

// Config returns the configuration the Injector runs.
func (in *Injector) Config() *Config { return in.config }

// Run purges expired cache entries every interval until ctx is done: the
// kubelet only drops them when read, KEP-2133 asks for better.
func (in *Injector) Run(ctx context.Context, interval time.Duration) {
	for _, p := range in.plugins {
		go p.cache.Run(ctx, interval)
	}
	<-ctx.Done()
}

// Candidate is one credential to try for a pull, and where it came from.
type Candidate struct {
	Provider string
	// Key is the auth map key that matched the image.
	Key        string
	Credential Credential
	// ServiceAccount is the account whose token got the credential; nil for
	// node-wide credentials.
	ServiceAccount *pullreport.ServiceAccountRef
}

// ProviderError is a provider that matched an image but gave no answer.
type ProviderError struct {
	Provider string
	Err      error
}

// Lookup runs (or reads from cache) every provider whose matchImages match
// image, a repository without tag or digest, and returns the credentials to
// try, in order:
//   - auth keys that match the image by the same rules as matchImages,
//   - keys without a glob before keys with one, longer keys first (more
//     specific), then the kubelet's reverse lexical order, then the order of
//     the providers in the configuration (the earlier wins a shared key),
//   - for a Docker Hub image with no other match, keys for index.docker.io,
//     as the kubelet's keyring falls back to them,
//   - each distinct credential once.
//
// Providers that failed are returned as well; the others' candidates are
// still usable.
func (in *Injector) Lookup(ctx context.Context, image string, pod *PodRef) ([]Candidate, []Answer, []ProviderError) {
	var answers []Answer
	var failed []ProviderError
	for _, p := range in.plugins {
		if !p.matches(image) {
			continue
		}
		a, err := p.provide(ctx, image, pod)
		if err != nil {
			if errors.Is(err, ErrNoServiceAccountCredential) {
				in.log.Debug("token credential provider not run for this pod", "plugin", p.cfg.Name, "image", image, "reason", err)
			} else {
				in.log.Warn("credential provider failed", "plugin", p.cfg.Name, "image", image, "err", err)
			}
			failed = append(failed, ProviderError{Provider: p.cfg.Name, Err: err})
			continue
		}
		answers = append(answers, a)
	}
	return candidates(image, answers), answers, failed
}

// candidates orders the credentials of answers for image.
func candidates(image string, answers []Answer) []Candidate {
	type ranked struct {
		Candidate
		key      string // Key normalized (AuthKey): what the order compares
		provider int
	}
	var all, hub []ranked
	for i, a := range answers {
		for raw, cred := range a.Auth {
			k, ok := keyring.AuthKey(raw)
			if !ok {
				continue
			}
			c := ranked{Candidate{Provider: a.Provider, Key: raw, Credential: cred, ServiceAccount: a.ServiceAccount}, k, i}
			if keyring.MatchImage(k, image) {
				all = append(all, c)
			} else if k == "index.docker.io" && keyring.IsDefaultRegistryImage(image) {
				hub = append(hub, c)
			}
		}
	}
	if len(all) == 0 {
		all = hub
	}
	sort.SliceStable(all, func(i, j int) bool {
		a, b := all[i], all[j]
		ka, kb := a.key, b.key
		if wa, wb := keyring.IsWildcard(ka), keyring.IsWildcard(kb); wa != wb {
			return !wa
		}
		if len(ka) != len(kb) {
			return len(ka) > len(kb)
		}
		if ka != kb {
			return ka > kb
		}
		return a.provider < b.provider
	})
	var out []Candidate
	seen := map[Credential]bool{}
	for _, c := range all {
		if seen[c.Credential] {
			continue // the same credential under another key: one try is enough
		}
		seen[c.Credential] = true
		out = append(out, c.Candidate)
	}
	return out
}
