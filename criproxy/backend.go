package criproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// MaxMessageSize is the largest message the proxy accepts or sends, each
// way: 16 MiB, like the kubelet's CRI client and containerd.
const MaxMessageSize = 16 << 20

// Backend is the container runtime the proxy forwards to. Image is the
// connection for the ImageService and is the same as Runtime unless a
// separate image endpoint is configured (the kubelet's
// --image-service-endpoint). It is safe for concurrent use.
type Backend struct {
	Runtime *grpc.ClientConn
	Image   *grpc.ClientConn

	// RuntimeEndpoint and ImageEndpoint are the normalised endpoints.
	RuntimeEndpoint, ImageEndpoint string

	// links are the runtime's connection, then the image endpoint's if it
	// is separate.
	links []*link
}

// Dial connects to the runtime. imageEndpoint may be empty. Connections are
// made lazily and re-made after the runtime restarts (Watch re-makes them
// at once): while it is away, calls fail with Unavailable and nothing needs
// restarting.
func Dial(runtimeEndpoint, imageEndpoint string) (*Backend, error) {
	rt, err := ParseEndpoint(runtimeEndpoint)
	if err != nil {
		return nil, fmt.Errorf("runtime endpoint %q: %w", runtimeEndpoint, err)
	}
	img := rt
	if imageEndpoint != "" {
		if img, err = ParseEndpoint(imageEndpoint); err != nil {
			return nil, fmt.Errorf("image endpoint %q: %w", imageEndpoint, err)
		}
	}
	b := &Backend{RuntimeEndpoint: rt, ImageEndpoint: img}
	runtime, err := dial("runtime", rt)
	if err != nil {
		return nil, err
	}
	b.links = []*link{runtime}
	b.Runtime, b.Image = runtime.cc, runtime.cc
	if img != rt {
		image, err := dial("image service", img)
		if err != nil {
			b.Runtime.Close()
			return nil, err
		}
		b.links = append(b.links, image)
		b.Image = image.cc
	}
	return b, nil
}

func dial(role, endpoint string) (*link, error) {
	l := &link{role: role, endpoint: endpoint}
	var err error
	l.cc, err = grpc.NewClient(endpoint,
		// Every call to the runtime, the proxy's own included, says which
		// runtime is away when it fails for want of a connection.
		grpc.WithChainUnaryInterceptor(l.explainUnary),
		grpc.WithChainStreamInterceptor(l.explainStream),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)),
		// Reconnect quickly once the runtime is back: a restart of containerd
		// takes a second or two and the kubelet retries on its own. The
		// kubelet's own CRI client does alike (k8s.io/cri-client: 100ms
		// base, 3s at most, 5s to connect); gRPC's default would wait up to
		// 120s between attempts. Calls do not wait for the connection
		// (no WaitForReady), as the kubelet's do not: while the runtime is
		// away they fail at once with Unavailable and the kubelet retries.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// Keep the connection: the first call after an idle period would
		// otherwise pay for a new one.
		grpc.WithIdleTimeout(0),
		// The proxy reads a whole message before it forwards it: with the
		// default 64 KiB windows a large answer (ListImages of a busy node)
		// waits for window updates on this hop as well as on the caller's.
		// Messages are bounded by MaxMessageSize anyway.
		grpc.WithInitialWindowSize(MaxMessageSize),
		grpc.WithInitialConnWindowSize(MaxMessageSize),
	)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// ParseEndpoint accepts "unix:///path" or an absolute path, as the kubelet
// and crictl do on Linux, and returns the "unix:///path" form.
func ParseEndpoint(endpoint string) (string, error) {
	path := endpoint
	switch {
	case endpoint == "":
		return "", fmt.Errorf("endpoint is empty")
	case strings.HasPrefix(endpoint, "unix://"):
		path = strings.TrimPrefix(endpoint, "unix://")
	case strings.Contains(endpoint, "://"):
		return "", fmt.Errorf("only unix sockets are supported, as unix:///path/to.sock")
	}
	// "unix://relative/path" is a common slip.
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("the socket path must be absolute, as unix:///path/to.sock")
	}
	// gRPC reads the endpoint as a URL: these would change the path it dials.
	if strings.ContainsAny(path, "?#%") {
		return "", fmt.Errorf("the socket path must not contain ?, # or %%")
	}
	return "unix://" + filepath.Clean(path), nil
}

// conn returns the connection that serves fullMethod.
func (b *Backend) conn(fullMethod string) *grpc.ClientConn {
	if isImageService(fullMethod) {
		return b.Image
	}
	return b.Runtime
}

// Ready reports whether the runtime answers: Version on the runtime
// endpoint and, when the image endpoint is separate, ImageFsInfo there.
func (b *Backend) Ready(ctx context.Context) error {
	if _, err := runtimeapi.NewRuntimeServiceClient(b.Runtime).Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		return fmt.Errorf("runtime %s: Version: %w", b.RuntimeEndpoint, err)
	}
	if b.Image != b.Runtime {
		if _, err := runtimeapi.NewImageServiceClient(b.Image).ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{}); err != nil {
			return fmt.Errorf("image service %s: ImageFsInfo: %w", b.ImageEndpoint, err)
		}
	}
	return nil
}

// reconnectInterval bounds how often Watch re-makes a connection the
// runtime closed: a runtime that accepts and at once closes every
// connection gets a new one a second, not a busy loop. gRPC's own backoff
// paces the attempts while the runtime is away.
const reconnectInterval = time.Second

// recheckInterval is how long Watch waits for a change of a connection's
// state before it looks again: gRPC reports changes one at a time, and
// one that came and went between two looks would otherwise be noticed
// only at the next.
const recheckInterval = 2 * time.Second

// link is one connection to the runtime (the runtime endpoint's, or the
// image endpoint's) and what the log last said of it.
type link struct {
	cc             *grpc.ClientConn
	role, endpoint string

	// mu orders what Watch and explainAway see of the connection's state
	// with what the log says: each reads the state under it.
	mu    sync.Mutex
	log   *slog.Logger // nil until Watch runs: then nothing is logged
	known bool         // the log said up or away
	up    bool
	// ups counts the times the connection came up: a call that began
	// before the last of them failed on a connection already replaced.
	ups atomic.Uint64
}

// upLocked and awayLocked note the connection up or away, logging a
// change, once. Away is a failed connection attempt or a call that failed
// for want of a connection; a connection lost and at once re-made (the
// runtime closed an idle one, say) is no news.
func (l *link) upLocked() {
	if !l.up {
		l.ups.Add(1)
	}
	if l.log != nil && !l.up {
		if l.known {
			l.log.Info("the runtime is back", "service", l.role, "endpoint", l.endpoint)
		} else {
			l.log.Info("connected to the runtime", "service", l.role, "endpoint", l.endpoint)
		}
	}
	l.known, l.up = true, true
}

func (l *link) awayLocked() {
	if l.log != nil && (l.up || !l.known) {
		l.log.Warn("the runtime is away: calls to it fail with Unavailable until it is back", "service", l.role, "endpoint", l.endpoint)
	}
	l.known, l.up = true, false
}

// Watch keeps the connections to the runtime up until ctx is done, and
// logs when one is lost (the runtime is away) and when it is back, one
// line per change. gRPC by itself re-makes a connection the runtime
// closed only at the next call: reconnecting at once makes the first call
// after a restart find it up, and the log say when the runtime is back.
// Run it once.
func (b *Backend) Watch(ctx context.Context, log *slog.Logger) {
	var wg sync.WaitGroup
	for _, l := range b.links {
		l.mu.Lock()
		l.log = log
		l.mu.Unlock()
		wg.Go(func() { l.watch(ctx) })
	}
	wg.Wait()
}

func (l *link) watch(ctx context.Context) {
	var lastConnect time.Time
	for {
		l.mu.Lock()
		state := l.cc.GetState()
		switch state {
		case connectivity.Ready:
			l.upLocked()
		case connectivity.TransientFailure:
			l.awayLocked()
		}
		l.mu.Unlock()
		wait := recheckInterval
		switch state {
		case connectivity.Shutdown:
			return
		case connectivity.Idle:
			if since := time.Since(lastConnect); since < reconnectInterval {
				wait = reconnectInterval - since
			} else {
				lastConnect = time.Now()
				l.cc.Connect()
			}
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		l.cc.WaitForStateChange(wctx, state)
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// explainAway adds to an Unavailable error that the connection to the
// runtime gave, not the runtime itself, that the runtime is away and which
// one: gRPC's own words ("connection error", "error reading from server")
// do not say it. The code and details stay. The caller has made sure the
// runtime did not answer: the connection's state cannot tell, as gRPC
// updates it after a new connection has carried its first calls. began is
// the count of ups (link.ups) when the call began.
func (l *link) explainAway(err error, began uint64) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	l.mu.Lock()
	state := l.cc.GetState()
	// A call failed for want of a connection: that is news even when Watch
	// missed the failed attempts (the call made them, between two of its
	// looks). Watch says when it is back. A call that began before the
	// connection last came up failed on the one that was away then: its
	// failure is no news once the log said the runtime is back.
	if l.ups.Load() == began {
		l.awayLocked()
	}
	l.mu.Unlock()
	var how string
	switch state {
	case connectivity.TransientFailure:
		how = "cannot connect"
	case connectivity.Connecting:
		how = "connecting"
	case connectivity.Ready:
		how = "the connection broke during the call; a new one is up"
	default:
		how = "the connection broke"
	}
	p := status.Convert(err).Proto()
	p.Message = fmt.Sprintf("cri-image-proxy: the %s at %s is away (%s): %s", l.role, l.endpoint, how, p.GetMessage())
	return status.FromProto(p).Err()
}

// answered reports whether the runtime answered a call that ended with
// header and trailer: every answer carries one or the other (with its
// content-type at least); a call the connection failed has neither.
func answered(header, trailer metadata.MD) bool {
	return len(header) > 0 || len(trailer) > 0
}

func (l *link) explainUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	// The proxy's own paths ask for the header and trailer already: use
	// theirs, and add options only for a call that does not.
	var header, trailer *metadata.MD
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			header = o.HeaderAddr
		case grpc.TrailerCallOption:
			trailer = o.TrailerAddr
		}
	}
	if header == nil || trailer == nil {
		opts = opts[:len(opts):len(opts)] // append to a copy, never to the caller's array
		if header == nil {
			header = new(metadata.MD)
			opts = append(opts, grpc.Header(header))
		}
		if trailer == nil {
			trailer = new(metadata.MD)
			opts = append(opts, grpc.Trailer(trailer))
		}
	}
	began := l.ups.Load()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil || answered(*header, *trailer) {
		return err
	}
	return l.explainAway(err, began)
}

func (l *link) explainStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	began := l.ups.Load()
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		// The runtime's answer comes with RecvMsg: this is the connection's.
		return nil, l.explainAway(err, began)
	}
	return explainedStream{ClientStream: cs, l: l, began: began}, nil
}

// explainedStream explains the error that ends a stream: the connection
// may go while it runs.
type explainedStream struct {
	grpc.ClientStream
	l     *link
	began uint64 // the link's ups when the stream began
}

func (s explainedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil || errors.Is(err, io.EOF) {
		return err // a message, or the stream's end as the caller expects it
	}
	// The stream has ended: Header returns at once.
	header, _ := s.ClientStream.Header()
	if answered(header, s.ClientStream.Trailer()) {
		return err
	}
	return s.l.explainAway(err, s.began)
}

// Close closes the connections.
func (b *Backend) Close() error {
	err := b.Runtime.Close()
	if b.Image != b.Runtime {
		if ierr := b.Image.Close(); err == nil {
			err = ierr
		}
	}
	return err
}
