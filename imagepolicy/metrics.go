package imagepolicy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/internal/execplugin"
)

// metrics of image policy. Labels are provider names and fixed words,
// never images, pods or credentials.
type metrics struct {
	decisions   *prometheus.CounterVec   // provider, call, result, source
	calls       *prometheus.CounterVec   // provider, result
	duration    *prometheus.HistogramVec // provider
	info        *prometheus.GaugeVec     // hash
	fileChanges *prometheus.CounterVec   // provider
}

// Results of a provider's decision, the decisions' "result" label.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultFailedClosed = "failed_closed" // a fault under failurePolicy Fail: refused
	resultFailedOpen   = "failed_open"   // a fault under failurePolicy Ignore: allowed
	resultNoProvider   = "no_provider"   // no provider applies: allowed (noMatchPolicy Allow)
	// No provider applies, and the namespace's noMatchPolicy is Warn:
	// allowed, and logged.
	resultNoProviderWarned = "no_provider_warned"
	// No provider applies, and the namespace's noMatchPolicy is Deny:
	// refused.
	resultNoProviderDenied = "no_provider_denied"
)

// Results of a plugin run, the calls' "result" label.
const (
	callSuccess         = "success"
	callFailed          = "failed" // non-zero exit, crash, could not start
	callTimeout         = "timeout"
	callInvalidResponse = "invalid_response"
	callOutputTooLarge  = "output_too_large"
)

func callResult(err error) string {
	switch {
	case err == nil:
		return callSuccess
	case errors.Is(err, execplugin.ErrTimeout):
		return callTimeout
	case errors.Is(err, policyapi.ErrInvalidResponse):
		return callInvalidResponse
	case errors.Is(err, execplugin.ErrOutputLimit):
		return callOutputTooLarge
	}
	return callFailed
}

// cacheEntries is the image_policy_cache_entries gauge of the providers
// configured now: a collector, so that a reload's providers appear and the
// removed ones go.
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

func newMetrics(reg prometheus.Registerer, cacheSizes func() map[string]int) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "decisions_total",
			Help: "Image policy decisions, by provider (empty when none applied), call (PullImage, CreateContainer, ImageVolume; invalid for a subject that cannot be decided on), result (allowed, denied, failed_closed, failed_open; with no provider applying, by the namespace's noMatchPolicy: no_provider (Allow), no_provider_warned (Warn, allowed), no_provider_denied (Deny)) and source (plugin, cache).",
		}, []string{"provider", "call", "result", "source"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "plugin_calls_total",
			Help: "Image policy plugin executions, by provider and result (success, failed, timeout, invalid_response, output_too_large).",
		}, []string{"provider", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "plugin_duration_seconds",
			Help:    "Time an image policy plugin took to answer.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"provider"}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "cri_image_proxy", Name: "image_policy_config_info",
			Help: "Hash of the image policy configuration in use, as a label.",
		}, []string{"hash"}),
		fileChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "watched_file_changes_total",
			Help: "Changes of a provider's watchFiles (the plugin's own policy and key files) seen, each dropping the provider's cached verdicts, by provider.",
		}, []string{"provider"}),
	}
	if reg == nil {
		return m, nil
	}
	entries := cacheEntries{sizes: cacheSizes, desc: prometheus.NewDesc("cri_image_proxy_image_policy_cache_entries",
		"Cached verdicts of a provider (per image digest or ID and namespace), expired ones not yet purged included.", []string{"provider"}, nil)}
	for _, c := range []prometheus.Collector{m.decisions, m.calls, m.duration, m.info, m.fileChanges, entries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) setConfigHash(hash string) {
	m.info.Reset()
	m.info.WithLabelValues(hash).Set(1)
}
