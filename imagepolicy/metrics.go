package imagepolicy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// kind is how image policy plugins are named in their configuration's
// errors, their metrics and the log. Labels are provider names and fixed
// words, never images, pods or credentials.
var kind = execplugin.Kind{
	Config: "image policy config",
	Label:  "provider",
	Calls: execplugin.Metric{Name: "cri_image_proxy_image_policy_plugin_calls_total",
		Help: "Image policy plugin executions, by provider and result (success, failed, timeout, invalid_response, output_too_large)."},
	Duration: execplugin.Metric{Name: "cri_image_proxy_image_policy_plugin_duration_seconds",
		Help: "Time an image policy plugin took to answer."},
	ConfigInfo: execplugin.Metric{Name: "cri_image_proxy_image_policy_config_info",
		Help: "Hash of the image policy configuration in use, as a label."},
	CacheEntries: execplugin.Metric{Name: "cri_image_proxy_image_policy_cache_entries",
		Help: "Cached verdicts of a provider (per image digest or ID and namespace), expired ones not yet purged included."},
	// Lookups are counted by decisions_total's source label; evictions are
	// not counted.
	Stderr:             "image policy plugin wrote to stderr",
	ErrInvalidResponse: policyapi.ErrInvalidResponse,
}

// metrics of image policy's own; the plugins' run and cache metrics are
// the framework's (kind).
type metrics struct {
	decisions   *prometheus.CounterVec // provider, call, result, source
	fileChanges *prometheus.CounterVec // provider
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

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "decisions_total",
			Help: "Image policy decisions, by provider (empty when none applied), call (PullImage, CreateContainer, ImageVolume; invalid for a subject that cannot be decided on), result (allowed, denied, failed_closed, failed_open; with no provider applying, by the namespace's noMatchPolicy: no_provider (Allow), no_provider_warned (Warn, allowed), no_provider_denied (Deny)) and source (plugin, cache).",
		}, []string{"provider", "call", "result", "source"}),
		fileChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy", Subsystem: "image_policy", Name: "watched_file_changes_total",
			Help: "Changes of a provider's watchFiles (the plugin's own policy and key files) seen, each dropping the provider's cached verdicts, by provider.",
		}, []string{"provider"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.decisions, m.fileChanges} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
