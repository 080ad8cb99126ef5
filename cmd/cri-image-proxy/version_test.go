package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(buildInfoMetric())
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || families[0].GetName() != "cri_image_proxy_build_info" {
		t.Fatalf("gathered %v, %v", families, err)
	}
	m := families[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["version"] != version || labels["goversion"] == "" || labels["cri_api"] == "" {
		t.Errorf("build_info %v = %v", labels, m.GetGauge().GetValue())
	}
}
