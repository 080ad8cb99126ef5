package execplugin

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/cri-image-proxy/cri-image-proxy/authcache"
	"github.com/cri-image-proxy/cri-image-proxy/internal/periodic"
)

// Kind names a kind of exec plugin where operators see it: in its
// configuration's errors, its metrics and its log. A kind's values never
// change: dashboards and alerts read its metric names and labels.
type Kind struct {
	// Config names the configuration in errors ("image policy config").
	Config string
	// Label is the metric label that names a provider ("plugin").
	Label string
	// Calls counts plugin runs, by provider and result (success, failed,
	// timeout, invalid_response, output_too_large); Duration times them,
	// by provider.
	Calls, Duration Metric
	// ConfigInfo shows the hash of the configuration in use (label hash).
	ConfigInfo Metric
	// CacheEntries gauges the entries of each current provider's cache.
	CacheEntries Metric
	// CacheLookups counts cache lookups, by provider and result (hit,
	// miss); CacheEvictions, live entries dropped because a cache was
	// full, by provider. A kind without them leaves their Name empty.
	CacheLookups, CacheEvictions Metric
	// Stderr is the message of the debug line that quotes a plugin's
	// stderr.
	Stderr string
	// ErrInvalidResponse marks the kind's invalid answers: such a call's
	// result is invalid_response.
	ErrInvalidResponse error
}

// Metric is a metric's full name and its help.
type Metric struct{ Name, Help string }

// Options configure a Host. The zero value is usable.
type Options struct {
	// CacheSize bounds each provider's cache; 0 means authcache's default.
	CacheSize int
	// Clock drives the caches and times the runs; nil means the real clock.
	Clock clock.WithTicker
	// Logger receives the plugins' diagnostics; nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
}

// Runtime is what the providers of a kind share: the kind, the clock, the
// logger, the bound of their caches and the metrics.
type Runtime struct {
	kind      Kind
	clock     clock.WithTicker
	log       *slog.Logger
	cacheSize int
	metrics   *metrics
}

// Clock is the runtime's clock.
func (rt *Runtime) Clock() clock.WithTicker { return rt.clock }

// Log is the runtime's logger.
func (rt *Runtime) Log() *slog.Logger { return rt.log }

// Set is one configuration's providers, as a kind builds them: what a
// reload replaces whole.
type Set[P Member] interface {
	// ConfigHash identifies the configuration the set was built from.
	ConfigHash() string
	// Members are its providers, in order.
	Members() []P
}

// Member is a kind's provider: a type that embeds *Plugin.
type Member interface {
	member() (name string, cache cacheStats)
}

// cacheStats is what the host does with a provider's cache: count and purge.
type cacheStats interface {
	Len() int
	Purge() int
}

// Host holds a kind's current provider set S, swapped atomically (Install)
// while it serves: a caller that loaded the set (Current) finishes with it,
// whatever is installed meanwhile. It purges the current providers' caches
// (Run) and exports the kind's run and cache metrics. It is safe for
// concurrent use.
type Host[S Set[P], P Member] struct {
	*Runtime
	current atomic.Pointer[S]
}

// NewHost returns a Host for kind with nothing installed, its metrics
// registered with opts.Registerer.
func NewHost[S Set[P], P Member](kind Kind, opts Options) (*Host[S, P], error) {
	h := &Host[S, P]{Runtime: &Runtime{kind: kind, clock: opts.Clock, log: opts.Logger, cacheSize: opts.CacheSize}}
	if h.clock == nil {
		h.clock = clock.RealClock{}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if h.metrics, err = newMetrics(&kind, opts.Registerer, h.cacheSizes); err != nil {
		return nil, err
	}
	return h, nil
}

// Install makes set the current one, and its configuration's hash the one
// the config info metric shows.
func (h *Host[S, P]) Install(set S) {
	h.current.Store(&set)
	h.metrics.info.Reset()
	h.metrics.info.WithLabelValues(set.ConfigHash()).Set(1)
}

// Current is the set installed last; the zero S before any.
func (h *Host[S, P]) Current() S {
	if s := h.current.Load(); s != nil {
		return *s
	}
	var zero S
	return zero
}

// Run purges the expired entries of the current providers' caches every
// interval until ctx is done: the kubelet only drops them when read,
// KEP-2133 asks for better.
func (h *Host[S, P]) Run(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, func(context.Context) {
		for _, p := range h.Current().Members() {
			_, c := p.member()
			c.Purge()
		}
	})
}

// cacheSizes are the entries of each current provider's cache, by name.
func (h *Host[S, P]) cacheSizes() map[string]int {
	out := map[string]int{}
	if s := h.current.Load(); s != nil {
		for _, p := range (*s).Members() {
			name, c := p.member()
			out[name] = c.Len()
		}
	}
	return out
}

// Plugin is one configured provider as every kind has it: its name, the
// runner of its plugin, and its cache of V. A kind's provider embeds it
// and adds the kind's semantics (what a lookup keys on, what an answer
// means).
type Plugin[Req, Resp, V any] struct {
	Name   string
	Runner Runner[Req, Resp]
	// Cache is bounded by the runtime's cache size, its evictions counted
	// when the kind counts them; a Host purges it.
	Cache *authcache.Cache[V]

	hooks Hooks[Req, Resp]
	rt    *Runtime
}

// Hooks are what a kind says of its calls.
type Hooks[Req, Resp any] struct {
	// Image names a request's image in the log.
	Image func(Req) string
	// Secrets are what the log must never show of a call: the request's,
	// and the answer's (resp is the zero value when there is none).
	Secrets func(req Req, resp Resp) []string
	// Check, when set, judges a decoded answer to req: its error, which
	// wraps Kind.ErrInvalidResponse, is the call's.
	Check func(req Req, resp Resp) error
}

// NewPlugin returns the provider name of rt's kind, running r, with an
// empty cache of V (a caller names V; the rest is inferred:
// NewPlugin[Answer](rt, name, r, hooks)).
func NewPlugin[V, Req, Resp any](rt *Runtime, name string, r Runner[Req, Resp], hooks Hooks[Req, Resp]) *Plugin[Req, Resp, V] {
	opts := authcache.Options{Clock: rt.clock, MaxEntries: rt.cacheSize}
	if ev := rt.metrics.evictions; ev != nil {
		opts.OnEvict = func(n int) { ev.WithLabelValues(name).Add(float64(n)) }
	}
	return &Plugin[Req, Resp, V]{Name: name, Runner: r, Cache: authcache.New[V](opts), hooks: hooks, rt: rt}
}

func (p *Plugin[Req, Resp, V]) member() (string, cacheStats) { return p.Name, p.Cache }

// Now is the time on the runtime's clock.
func (p *Plugin[Req, Resp, V]) Now() time.Time { return p.rt.clock.Now() }

// Log is the runtime's logger.
func (p *Plugin[Req, Resp, V]) Log() *slog.Logger { return p.rt.log }

// Call runs the plugin once for req and accounts for the run: its
// duration observed, its answer judged (Hooks.Check), the call counted by
// its result, and its stderr logged at debug level, capped, with the
// call's secrets and anything secret-shaped masked. The plugin's stdout is
// never logged.
func (p *Plugin[Req, Resp, V]) Call(ctx context.Context, req Req) (Resp, error) {
	start := p.rt.clock.Now()
	resp, stderr, err := p.Runner.Run(ctx, req)
	p.rt.metrics.duration.WithLabelValues(p.Name).Observe(p.rt.clock.Since(start).Seconds())
	if err == nil && p.hooks.Check != nil {
		err = p.hooks.Check(req, resp)
	}
	if len(stderr) > 0 && p.rt.log.Enabled(ctx, slog.LevelDebug) {
		var known []string
		if p.hooks.Secrets != nil {
			known = p.hooks.Secrets(req, resp)
		}
		image := ""
		if p.hooks.Image != nil {
			image = p.hooks.Image(req)
		}
		p.rt.log.DebugContext(ctx, p.rt.kind.Stderr, "plugin", p.Name, "image", image, "stderr", ForLog(stderr, known...))
	}
	p.rt.metrics.calls.WithLabelValues(p.Name, p.rt.callResult(err)).Inc()
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp, nil
}

// CountLookup counts a lookup of the provider's cache, when the kind
// counts them.
func (p *Plugin[Req, Resp, V]) CountLookup(hit bool) {
	if l := p.rt.metrics.lookups; l != nil {
		result := "miss"
		if hit {
			result = "hit"
		}
		l.WithLabelValues(p.Name, result).Inc()
	}
}

// The results of a call, the calls' result label.
const (
	resultSuccess         = "success"
	resultFailed          = "failed" // non-zero exit, crash, could not start
	resultTimeout         = "timeout"
	resultInvalidResponse = "invalid_response"
	resultOutputTooLarge  = "output_too_large"
)

func (rt *Runtime) callResult(err error) string {
	switch {
	case err == nil:
		return resultSuccess
	case errors.Is(err, ErrTimeout):
		return resultTimeout
	case rt.kind.ErrInvalidResponse != nil && errors.Is(err, rt.kind.ErrInvalidResponse):
		return resultInvalidResponse
	case errors.Is(err, ErrOutputLimit):
		return resultOutputTooLarge
	}
	return resultFailed
}

// metrics are a kind's run and cache metrics. Labels are provider names
// and fixed words, never images or credentials.
type metrics struct {
	calls     *prometheus.CounterVec   // provider, result
	duration  *prometheus.HistogramVec // provider
	info      *prometheus.GaugeVec     // hash
	lookups   *prometheus.CounterVec   // provider, result (hit, miss); nil: not counted
	evictions *prometheus.CounterVec   // provider; nil: not counted
}

// durationBuckets reach the default timeout of a run, a minute.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(k *Kind, reg prometheus.Registerer, cacheSizes func() map[string]int) (*metrics, error) {
	m := &metrics{
		calls:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: k.Calls.Name, Help: k.Calls.Help}, []string{k.Label, "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: k.Duration.Name, Help: k.Duration.Help, Buckets: durationBuckets}, []string{k.Label}),
		info:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: k.ConfigInfo.Name, Help: k.ConfigInfo.Help}, []string{"hash"}),
	}
	cs := []prometheus.Collector{m.calls, m.duration, m.info,
		cacheEntries{sizes: cacheSizes, desc: prometheus.NewDesc(k.CacheEntries.Name, k.CacheEntries.Help, []string{k.Label}, nil)}}
	if k.CacheLookups.Name != "" {
		m.lookups = prometheus.NewCounterVec(prometheus.CounterOpts{Name: k.CacheLookups.Name, Help: k.CacheLookups.Help}, []string{k.Label, "result"})
		cs = append(cs, m.lookups)
	}
	if k.CacheEvictions.Name != "" {
		m.evictions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: k.CacheEvictions.Name, Help: k.CacheEvictions.Help}, []string{k.Label})
		cs = append(cs, m.evictions)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// cacheEntries is the cache entries gauge of the providers installed now:
// a collector, so that a reload's providers appear and the removed ones go.
type cacheEntries struct {
	desc  *prometheus.Desc
	sizes func() map[string]int
}

func (c cacheEntries) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c cacheEntries) Collect(ch chan<- prometheus.Metric) {
	for name, n := range c.sizes() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), name)
	}
}
