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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
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
	host     *execplugin.Host[*providerSet, *plugin]
	identity Identity
	timeout  time.Duration
	pulls    *prometheus.CounterVec // result
	log      *slog.Logger
}

// providerSet is one configuration's providers, in the kubelet's order.
type providerSet struct {
	config  *Config
	plugins []*plugin
}

func (s *providerSet) ConfigHash() string { return s.config.Hash }
func (s *providerSet) Members() []*plugin { return s.plugins }

// New returns an Injector for a loaded configuration.
func New(cfg *Config, opts Options) (*Injector, error) {
	host, err := execplugin.NewHost[*providerSet, *plugin](kind, execplugin.Options{
		CacheSize: opts.CacheSize, Clock: opts.Clock, Logger: opts.Logger, Registerer: opts.Registerer,
	})
	if err != nil {
		return nil, err
	}
	in := &Injector{host: host, identity: opts.Identity, timeout: opts.ExecTimeout, log: host.Log()}
	if in.pulls, err = newPullsMetric(opts.Registerer); err != nil {
		return nil, err
	}
	set, _, err := in.build(cfg, nil)
	if err != nil {
		return nil, err
	}
	in.host.Install(set)
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
	set, rep, err := in.build(cfg, in.host.Current())
	if err != nil {
		return ReloadReport{}, err
	}
	in.host.Install(set)
	return rep, nil
}

// build makes the providers of cfg, taking from old those whose
// definition is the same: their cached credentials are still what the
// plugin would answer. (An image policy reload keeps no verdict: a reload
// is how operators apply a changed policy its plugin reads.)
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
		if pc.TokenAttributes != nil && in.identity == nil {
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
	p := &plugin{cfg: pc, definition: id, identity: in.identity}
	p.Plugin = execplugin.NewPlugin[Answer](in.host.Runtime, pc.Name, runner(newExecPlugin(pc, binDir, in.timeout)), execplugin.Hooks[execRequest, *credentialproviderapi.CredentialProviderResponse]{
		Image:   func(req execRequest) string { return req.Image },
		Secrets: secretsOf,
		Check:   p.checkAnswer,
	})
	return p
}

// plugins returns the current providers.
func (in *Injector) plugins() []*plugin { return in.host.Current().plugins }

// Config returns the configuration the Injector runs now.
func (in *Injector) Config() *Config { return in.host.Current().config }

// Run purges expired cache entries of the current providers every interval
// until ctx is done: the kubelet only drops them when read, KEP-2133 asks
// for better.
func (in *Injector) Run(ctx context.Context, interval time.Duration) { in.host.Run(ctx, interval) }

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
