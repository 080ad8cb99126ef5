package testkit

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricDescriptions returns what c describes (every metric's name, help
// and labels), sorted: the text a test pins so that a move of a metric's
// registration cannot rename what dashboards and alerts read.
func MetricDescriptions(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var got []string
	for d := range ch {
		got = append(got, d.String())
	}
	slices.Sort(got)
	return got
}
