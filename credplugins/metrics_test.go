package credplugins

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// TestMetricDescriptions: operators' dashboards and the alerts of
// deploy/monitoring name these metrics and labels; what the injector registers
// stays as it is, to the letter.
func TestMetricDescriptions(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := New(&Config{Hash: "sha256:test"}, Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	got := testkit.MetricDescriptions(reg)
	want := []string{
		`Desc{fqName: "cri_image_proxy_credential_cache_entries", help: "Entries in a plugin's credential cache, expired ones not yet purged included.", unit: "", constLabels: {}, variableLabels: {plugin}}`,
		`Desc{fqName: "cri_image_proxy_credential_cache_evictions_total", help: "Live credential cache entries dropped because the cache was full.", unit: "", constLabels: {}, variableLabels: {plugin}}`,
		`Desc{fqName: "cri_image_proxy_credential_cache_lookups_total", help: "Credential cache lookups, by plugin and result (hit, miss).", unit: "", constLabels: {}, variableLabels: {plugin,result}}`,
		`Desc{fqName: "cri_image_proxy_credential_injection_pulls_total", help: "PullImage calls seen by credential injection, by result: request_auth (pulled with the request's own credentials), request_auth_fallback (the registry refused the request's credentials, a provider's were accepted), anonymous (no provider had credentials), injected (pulled with a provider's credential), failed (every candidate failed).", unit: "", constLabels: {}, variableLabels: {result}}`,
		`Desc{fqName: "cri_image_proxy_credential_plugin_calls_total", help: "Credential provider plugin executions, by plugin and result (success, failed, timeout, invalid_response, output_too_large).", unit: "", constLabels: {}, variableLabels: {plugin,result}}`,
		`Desc{fqName: "cri_image_proxy_credential_plugin_duration_seconds", help: "Time a credential provider plugin took to answer.", unit: "", constLabels: {}, variableLabels: {plugin}}`,
		`Desc{fqName: "cri_image_proxy_credential_provider_config_info", help: "Hash of the credential provider configuration in use, as a label (the kubelet's credential_provider_config_info).", unit: "", constLabels: {}, variableLabels: {hash}}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}
