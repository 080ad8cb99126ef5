package monitoring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc reports whether the daemon can serve: nil when ready.
type ReadyFunc func(ctx context.Context) error

// readyTimeout bounds one readiness check: the runtime answers Version in
// well under a millisecond when it is healthy.
const readyTimeout = 2 * time.Second

// Server is the monitoring endpoint.
type Server struct {
	http *http.Server
}

// Options configure a Server.
type Options struct {
	// Profiling serves net/http/pprof under /debug/pprof/.
	Profiling bool
	// Checks are more readiness checks for /readyz, after the backend's:
	// the proxy may serve the runtime yet not be ready for pods.
	Checks []ReadyFunc
}

// New returns a Server for the metrics in gatherer and the readiness
// check backend (then opts.Checks). It also registers
// cri_image_proxy_backend_up on reg, from backend alone.
func New(reg prometheus.Registerer, gatherer prometheus.Gatherer, backend ReadyFunc, log *slog.Logger, opts Options) (*Server, error) {
	ready := func(ctx context.Context) error {
		if err := backend(ctx); err != nil {
			return err
		}
		for _, c := range opts.Checks {
			if err := c(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "cri_image_proxy",
		Name:      "backend_up",
		Help:      "1 when the container runtime behind the proxy answers, checked at scrape time.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		if backend(ctx) != nil {
			return 0
		}
		return 1
	})
	if err := reg.Register(up); err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if opts.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return &Server{http: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}, nil
}

// Serve serves on l until Shutdown, then returns nil.
func (s *Server) Serve(l net.Listener) error {
	if err := s.http.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server, waiting for requests in flight until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.http.Shutdown(ctx)
}
