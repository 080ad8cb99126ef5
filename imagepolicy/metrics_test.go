package imagepolicy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// TestMetricDescriptions: operators' dashboards and the alerts of
// deploy/monitoring name these metrics and labels; what the engine registers
// stays as it is, to the letter.
func TestMetricDescriptions(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := New(&Config{Hash: "sha256:test"}, Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	got := testkit.MetricDescriptions(reg)
	want := []string{
		`Desc{fqName: "cri_image_proxy_image_policy_cache_entries", help: "Cached verdicts of a provider (per image digest or ID and namespace), expired ones not yet purged included.", unit: "", constLabels: {}, variableLabels: {provider}}`,
		`Desc{fqName: "cri_image_proxy_image_policy_config_info", help: "Hash of the image policy configuration in use, as a label.", unit: "", constLabels: {}, variableLabels: {hash}}`,
		`Desc{fqName: "cri_image_proxy_image_policy_decisions_total", help: "Image policy decisions, by provider (empty when none applied), call (PullImage, CreateContainer, ImageVolume; invalid for a subject that cannot be decided on), result (allowed, denied, failed_closed, failed_open; with no provider applying, by the namespace's noMatchPolicy: no_provider (Allow), no_provider_warned (Warn, allowed), no_provider_denied (Deny)) and source (plugin, cache).", unit: "", constLabels: {}, variableLabels: {provider,call,result,source}}`,
		`Desc{fqName: "cri_image_proxy_image_policy_plugin_calls_total", help: "Image policy plugin executions, by provider and result (success, failed, timeout, invalid_response, output_too_large).", unit: "", constLabels: {}, variableLabels: {provider,result}}`,
		`Desc{fqName: "cri_image_proxy_image_policy_plugin_duration_seconds", help: "Time an image policy plugin took to answer.", unit: "", constLabels: {}, variableLabels: {provider}}`,
		`Desc{fqName: "cri_image_proxy_image_policy_watched_file_changes_total", help: "Changes of a provider's watchFiles (the plugin's own policy and key files) seen, each dropping the provider's cached verdicts, by provider.", unit: "", constLabels: {}, variableLabels: {provider}}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}
