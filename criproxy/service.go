package criproxy

import (
	"context"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Options configure a Server. The zero value serves a plain pass-through.
type Options struct {
	// Interceptors extend the proxy on the methods they are on, outermost
	// first (see Intercept).
	Interceptors []Interceptor
	// Logger receives request logs (debug level) and errors. Nil: discard.
	Logger *slog.Logger
	// Registerer receives the request metrics. Nil: no metrics.
	Registerer prometheus.Registerer
}

// Server is the CRI endpoint: it serves every RuntimeService and
// ImageService method, and any method it does not know, by forwarding it
// to the Backend; the methods interceptors are on go through them.
type Server struct {
	backend      *Backend
	interceptors []Interceptor
	log          *slog.Logger
	metrics      *metrics
	grpc         *grpc.Server
}

// New returns a Server that forwards to backend.
func New(backend *Backend, opts Options) (*Server, error) {
	if err := checkInterceptors(opts.Interceptors); err != nil {
		return nil, err
	}
	// The secret scrub is outermost on PullImage: nothing the runtime or a
	// hook says about the request's credential leaves the proxy.
	interceptors := append([]Interceptor{Intercept(PullImage, scrubPullSecrets)}, opts.Interceptors...)
	s := &Server{backend: backend, interceptors: interceptors, log: opts.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.metrics, err = newMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	s.grpc = grpc.NewServer(
		// Notes each connection's client process, for the last-call metric.
		grpc.Creds(peerCredentials{proc: "/proc"}),
		grpc.ForceServerCodecV2(codec{}),
		grpc.UnknownServiceHandler(s.passThrough),
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.ChainUnaryInterceptor(s.observeUnary),
		grpc.ChainStreamInterceptor(s.observeStream),
		// Stop waits for handlers, so that a hook's last write (a pull
		// record, say) is done before the process exits.
		grpc.WaitForHandlers(true),
		grpc.NumStreamWorkers(64),
	)
	for _, sd := range s.typedServices() {
		s.grpc.RegisterService(sd, nil)
	}
	return s, nil
}

// Serve accepts connections on l until Shutdown; it returns nil after a
// shutdown, and the listener's error otherwise.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != grpc.ErrServerStopped {
		return err
	}
	return nil
}

// Shutdown stops accepting new connections and calls at once, and waits for
// the calls in flight (a long PullImage, say) until ctx is done; then it
// cancels what is left and returns.
func (s *Server) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("shutdown timeout reached, cancelling the calls still in flight")
		s.grpc.Stop()
		<-done
	}
}
