package criproxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics of the CRI endpoint. Methods this build does not know are
// counted under service and method "unknown", so that a client cannot
// grow the label space.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// lastCall is the time of each client class's last call, resolved
	// once per class: it is set on every call.
	lastCall map[string]prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cri_image_proxy",
			Name:      "requests_total",
			Help:      "CRI calls handled, by service, method and gRPC status code.",
		}, []string{"service", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cri_image_proxy",
			Name:      "request_duration_seconds",
			Help:      "Time to answer a unary CRI call, by service and method.",
			// From a pass-through Version (~0.2 ms) to a large pull (minutes).
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"service", "method"}),
	}
	lastCall := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "cri_image_proxy",
		Name:      "client_last_call_timestamp_seconds",
		Help:      "When a client last called the proxy (Unix time), by client: kubelet, crictl (crictl and critest) or other, from the calling process's name. A kubelet that stops calling has been pointed elsewhere (cri-image-proxy doctor says where).",
	}, []string{"client"})
	m.lastCall = map[string]prometheus.Gauge{}
	for _, c := range []string{ClientKubelet, ClientCrictl, ClientOther} {
		m.lastCall[c] = lastCall.WithLabelValues(c)
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, lastCall} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (s *Server) observeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	s.observe(ctx, info.FullMethod, true, start, err)
	return resp, err
}

func (s *Server) observeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	s.observe(ss.Context(), info.FullMethod, isUnary(info.FullMethod), start, err)
	return err
}

// observe records one finished call. Streams get a count but no duration:
// their length says how long a client watched, not how fast we were.
func (s *Server) observe(ctx context.Context, fullMethod string, unary bool, start time.Time, err error) {
	elapsed := time.Since(start)
	code := status.Code(err)
	if s.metrics != nil {
		service, method := "unknown", "unknown"
		if isKnown(fullMethod) {
			service, method = splitMethod(fullMethod)
		}
		s.metrics.requests.WithLabelValues(service, method, code.String()).Inc()
		s.metrics.lastCall[clientOf(ctx)].SetToCurrentTime()
		if unary {
			s.metrics.duration.WithLabelValues(service, method).Observe(elapsed.Seconds())
		}
	}
	// Never log requests or responses: they may carry credentials.
	if s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.LogAttrs(ctx, slog.LevelDebug, "cri call",
			slog.String("method", fullMethod), slog.String("code", code.String()), slog.Duration("duration", elapsed))
	}
}
