package credplugins

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of credential injection. Labels are plugin names and fixed
// words, never images or credentials.
type metrics struct {
	calls     *prometheus.CounterVec   // plugin, result
	duration  *prometheus.HistogramVec // plugin
	lookups   *prometheus.CounterVec   // plugin, result (hit, miss)
	evictions *prometheus.CounterVec   // plugin
	pulls     *prometheus.CounterVec   // result
	info      *prometheus.GaugeVec     // hash
}

// setConfigHash makes hash the one credential_provider_config_info shows.
func (m *metrics) setConfigHash(hash string) {
	m.info.Reset()
	m.info.WithLabelValues(hash).Set(1)
}

// cacheEntries is the credential_cache_entries gauge of the providers
// configured now: a collector, so that a reload's providers appear and
// the removed ones go.
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

// Results of a plugin call, the "result" label.
const (
	resultSuccess         = "success"
	resultFailed          = "failed" // non-zero exit, crash, could not start
	resultTimeout         = "timeout"
	resultInvalidResponse = "invalid_response"
	resultOutputTooLarge  = "output_too_large"
)

func newMetrics(reg prometheus.Registerer, cacheSizes func() map[string]int) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "credential_plugin", Name: "calls_total",
			Help: "Credential provider plugin executions, by plugin and result (success, failed, timeout, invalid_response, output_too_large).",
		}, []string{"plugin", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cri_image_proxy", Subsystem: "credential_plugin", Name: "duration_seconds",
			Help:    "Time a credential provider plugin took to answer.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"plugin"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "credential_cache", Name: "lookups_total",
			Help: "Credential cache lookups, by plugin and result (hit, miss).",
		}, []string{"plugin", "result"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "credential_cache", Name: "evictions_total",
			Help: "Live credential cache entries dropped because the cache was full.",
		}, []string{"plugin"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "credential_injection", Name: "pulls_total",
			Help: "PullImage calls seen by credential injection, by result: request_auth (pulled with the request's own credentials), request_auth_fallback (the registry refused the request's credentials, a provider's were accepted), anonymous (no provider had credentials), injected (pulled with a provider's credential), failed (every candidate failed).",
		}, []string{"result"}),
	}
	m.info = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "cri_image_proxy", Name: "credential_provider_config_info",
		Help: "Hash of the credential provider configuration in use, as a label (the kubelet's credential_provider_config_info).",
	}, []string{"hash"})
	if reg == nil {
		return m, nil
	}
	entries := cacheEntries{sizes: cacheSizes, desc: prometheus.NewDesc("cri_image_proxy_credential_cache_entries",
		"Entries in a plugin's credential cache, expired ones not yet purged included.", []string{"plugin"}, nil)}
	cs := []prometheus.Collector{m.calls, m.duration, m.lookups, m.evictions, m.pulls, m.info, entries}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
