package podtoken

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/metrics"
)

// RegisterClientMetrics puts client-go's metrics on reg: the KEP-541
// exec credential plugin metrics of the kubeconfig's user
// (rest_client_exec_plugin_call_total, rest_client_exec_plugin_ttl_seconds,
// rest_client_exec_plugin_certificate_rotation_age) and the request
// results (rest_client_requests_total).
//
// client-go keeps one set of metric sinks per process and takes the first
// set it is given, ignoring the rest. The collectors are therefore made
// and handed to client-go once per process, and every call registers
// those same collectors: a registry given later (a second daemon in one
// process, a test run again) shows the live figures, never a set of
// counters client-go does not write to. The figures are the process's,
// as client-go's are.
func RegisterClientMetrics(reg prometheus.Registerer) error {
	for _, c := range clientMetrics().collectors() {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// clientMetricSet is the collectors client-go writes to.
type clientMetricSet struct {
	calls    *prometheus.CounterVec
	ttl      prometheus.Gauge
	rotation prometheus.Histogram
	requests *prometheus.CounterVec
}

func (m *clientMetricSet) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.ttl, m.rotation, m.requests}
}

// clientMetrics makes the collectors and hands them to client-go, on its
// first call in the process.
var clientMetrics = sync.OnceValue(func() *clientMetricSet {
	m := &clientMetricSet{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_exec_plugin_call_total",
			Help: "Calls to the kubeconfig's exec credential plugin, by exit code and call status (KEP-541).",
		}, []string{"code", "call_status"}),
		ttl: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rest_client_exec_plugin_ttl_seconds",
			Help: "Seconds until the exec plugin's client certificate expires (KEP-541); NaN when there is none.",
		}),
		rotation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rest_client_exec_plugin_certificate_rotation_age",
			Help:    "Age of a client certificate from the exec plugin when it was rotated (KEP-541).",
			Buckets: []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000},
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total",
			Help: "Kubernetes API requests, by status code, method and host.",
		}, []string{"code", "method", "host"}),
	}
	m.ttl.Set(nan())
	metrics.Register(metrics.RegisterOpts{
		ExecPluginCalls:       callsAdapter{m.calls},
		ClientCertExpiry:      &expiryAdapter{m.ttl},
		ClientCertRotationAge: durationAdapter{m.rotation},
		RequestResult:         resultAdapter{m.requests},
	})
	return m
})

type callsAdapter struct{ v *prometheus.CounterVec }

func (a callsAdapter) Increment(code int, status string) {
	a.v.WithLabelValues(strconv.Itoa(code), status).Inc()
}

type expiryAdapter struct{ g prometheus.Gauge }

func (a *expiryAdapter) Set(expiry *time.Time) {
	if expiry == nil {
		a.g.Set(nan())
		return
	}
	a.g.Set(time.Until(*expiry).Seconds())
}

type durationAdapter struct{ h prometheus.Histogram }

func (a durationAdapter) Observe(d time.Duration) { a.h.Observe(d.Seconds()) }

type resultAdapter struct{ v *prometheus.CounterVec }

func (a resultAdapter) Increment(_ context.Context, code, method, host string) {
	a.v.WithLabelValues(code, method, host).Inc()
}

func nan() float64 { return math.NaN() }
