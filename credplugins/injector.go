package credplugins

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/internal/periodic"
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
// the configured plugins. It is safe for concurrent use. Its providers can
// be replaced while it serves (Reload): a lookup uses the set current when
// it starts, so a pull in flight finishes under the configuration it
// started with.
type Injector struct {
	set     atomic.Pointer[providerSet]
	opts    Options
	clk     clock.WithTicker
	metrics *metrics
	log     *slog.Logger
}

// providerSet is one configuration's providers, in the kubelet's order.
type providerSet struct {
	config  *Config
	plugins []*plugin
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
	in := &Injector{log: log, opts: opts, clk: clk}
	var err error
	if in.metrics, err = newMetrics(opts.Registerer, in.currentCacheSizes); err != nil {
		return nil, err
	}
	set, _, err := in.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	in.install(set)
	return in, nil
}

// ReloadReport says what a Reload did to each provider, by name.
type ReloadReport struct {
	// Kept providers have the same definition (their configuration entry,
	// the bin directory and the executable's content): their caches stay.
	Kept []string
	// Changed providers start with an empty cache; Added too.
	Changed, Added, Removed []string
}

// Reload replaces the providers with cfg's, after checking all of it as
// New does: on error nothing changes. A provider whose definition did not
// change keeps its cache; the others' cached credentials are dropped.
// Lookups already running finish with the providers they started with.
func (in *Injector) Reload(cfg *Config) (ReloadReport, error) {
	old := in.set.Load()
	set, rep, err := in.build(cfg, old)
	if err != nil {
		return ReloadReport{}, err
	}
	in.install(set)
	return rep, nil
}

// install makes set the current one.
func (in *Injector) install(set *providerSet) {
	in.set.Store(set)
	in.metrics.setConfigHash(set.config.Hash)
}

// build makes the providers of cfg, taking from old those whose
// definition is the same.
func (in *Injector) build(cfg *Config, old *providerSet) (*providerSet, ReloadReport, error) {
	var rep ReloadReport
	set := &providerSet{config: cfg}
	previous := map[string]*plugin{}
	if old != nil {
		for _, p := range old.plugins {
			previous[p.cfg.Name] = p
		}
	}
	for _, pc := range cfg.Providers {
		if pc.TokenAttributes != nil && in.opts.Identity == nil {
			return nil, rep, fmt.Errorf("credential provider %s (%s) uses service account tokens (tokenAttributes): the proxy needs the Kubernetes API (kubernetes.kubeconfig, or in-cluster)", pc.Name, pc.File)
		}
		id, err := definition(pc, cfg.BinDir)
		if err != nil {
			return nil, rep, err
		}
		if p, ok := previous[pc.Name]; ok && p.definition == id {
			set.plugins = append(set.plugins, p)
			rep.Kept = append(rep.Kept, pc.Name)
			delete(previous, pc.Name)
			continue
		}
		if _, ok := previous[pc.Name]; ok {
			rep.Changed = append(rep.Changed, pc.Name)
			delete(previous, pc.Name)
		} else if old != nil {
			rep.Added = append(rep.Added, pc.Name)
		}
		set.plugins = append(set.plugins, in.newPlugin(pc, cfg.BinDir, id))
	}
	for name := range previous {
		rep.Removed = append(rep.Removed, name)
	}
	sort.Strings(rep.Removed)
	return set, rep, nil
}

func (in *Injector) newPlugin(pc Provider, binDir, id string) *plugin {
	name := pc.Name
	return &plugin{
		cfg:        pc,
		definition: id,
		identity:   in.opts.Identity,
		runner:     newExecPlugin(pc, binDir, in.opts.ExecTimeout),
		metrics:    in.metrics,
		log:        in.log,
		now:        in.clk.Now,
		cache: authcache.New[Answer](authcache.Options{Clock: in.clk, MaxEntries: in.opts.CacheSize, OnEvict: func(n int) {
			in.metrics.evictions.WithLabelValues(name).Add(float64(n))
		}}),
	}
}

// currentCacheSizes is the entries of each current provider's cache.
func (in *Injector) currentCacheSizes() map[string]int {
	out := map[string]int{}
	if set := in.set.Load(); set != nil {
		for _, p := range set.plugins {
			out[p.cfg.Name] = p.cache.Len()
		}
	}
	return out
}

// plugins returns the current providers.
func (in *Injector) plugins() []*plugin { return in.set.Load().plugins }

// Config returns the configuration the Injector runs now.
func (in *Injector) Config() *Config { return in.set.Load().config }

// Run purges expired cache entries of the current providers every interval
// until ctx is done: the kubelet only drops them when read, KEP-2133 asks
// for better.
func (in *Injector) Run(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, func(context.Context) {
		for _, p := range in.plugins() {
			p.cache.Purge()
		}
	})
}

// definition identifies what a provider does: its configuration entry
// (where it was declared aside), the bin directory, and the content of its
// executable, so that a replaced binary counts as a new provider whose
// cached credentials are not the old one's. An executable that cannot be
// read is named as such; running it will say why.
func definition(pc Provider, binDir string) (string, error) {
	pc.File = ""
	entry, err := json.Marshal(pc)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", entry, binDir)
	if f, err := os.Open(filepath.Join(binDir, pc.Name)); err == nil {
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("credential provider %s: reading its executable: %w", pc.Name, err)
		}
	} else {
		fmt.Fprintf(h, "unreadable: %v", err)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil)), nil
}
