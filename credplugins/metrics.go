package credplugins

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
)

// kind is how credential provider plugins are named in their
// configuration's errors, their metrics and the log. Labels are plugin
// names and fixed words, never images or credentials.
var kind = execplugin.Kind{
	Config: "credential provider config",
	Label:  "plugin",
	Calls: execplugin.Metric{Name: "cri_image_proxy_credential_plugin_calls_total",
		Help: "Credential provider plugin executions, by plugin and result (success, failed, timeout, invalid_response, output_too_large)."},
	Duration: execplugin.Metric{Name: "cri_image_proxy_credential_plugin_duration_seconds",
		Help: "Time a credential provider plugin took to answer."},
	ConfigInfo: execplugin.Metric{Name: "cri_image_proxy_credential_provider_config_info",
		Help: "Hash of the credential provider configuration in use, as a label (the kubelet's credential_provider_config_info)."},
	CacheEntries: execplugin.Metric{Name: "cri_image_proxy_credential_cache_entries",
		Help: "Entries in a plugin's credential cache, expired ones not yet purged included."},
	CacheLookups: execplugin.Metric{Name: "cri_image_proxy_credential_cache_lookups_total",
		Help: "Credential cache lookups, by plugin and result (hit, miss)."},
	CacheEvictions: execplugin.Metric{Name: "cri_image_proxy_credential_cache_evictions_total",
		Help: "Live credential cache entries dropped because the cache was full."},
	Stderr:             "credential provider plugin wrote to stderr",
	ErrInvalidResponse: ErrInvalidResponse,
}

// newPullsMetric is credential injection's own metric; the plugins' run
// and cache metrics are the framework's (kind).
func newPullsMetric(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	pulls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cri_image_proxy", Subsystem: "credential_injection", Name: "pulls_total",
		Help: "PullImage calls seen by credential injection, by result: request_auth (pulled with the request's own credentials), request_auth_fallback (the registry refused the request's credentials, a provider's were accepted), anonymous (no provider had credentials), injected (pulled with a provider's credential), failed (every candidate failed).",
	}, []string{"result"})
	if reg == nil {
		return pulls, nil
	}
	return pulls, reg.Register(pulls)
}
