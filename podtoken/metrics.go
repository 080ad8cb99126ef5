package podtoken

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/metrics"
)

// RegisterClientMetrics puts client-go's metrics on reg: the KEP-541
// exec credential plugin metrics of the kubeconfig's user
// (rest_client_exec_plugin_call_total, rest_client_exec_plugin_ttl_seconds,
// rest_client_exec_plugin_certificate_rotation_age) and the request
// results (rest_client_requests_total). client-go accepts one registration
// per process.
func RegisterClientMetrics(reg prometheus.Registerer) error {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_exec_plugin_call_total",
		Help: "Calls to the kubeconfig's exec credential plugin, by exit code and call status (KEP-541).",
	}, []string{"code", "call_status"})
	ttl := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rest_client_exec_plugin_ttl_seconds",
		Help: "Seconds until the exec plugin's client certificate expires (KEP-541); NaN when there is none.",
	})
	ttl.Set(nan())
	rotation := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rest_client_exec_plugin_certificate_rotation_age",
		Help:    "Age of a client certificate from the exec plugin when it was rotated (KEP-541).",
		Buckets: []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000},
	})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Kubernetes API requests, by status code, method and host.",
	}, []string{"code", "method", "host"})
	for _, c := range []prometheus.Collector{calls, ttl, rotation, requests} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	metrics.Register(metrics.RegisterOpts{
		ExecPluginCalls:       callsAdapter{calls},
		ClientCertExpiry:      &expiryAdapter{ttl},
		ClientCertRotationAge: durationAdapter{rotation},
		RequestResult:         resultAdapter{requests},
	})
	return nil
}

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
