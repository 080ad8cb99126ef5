package criproxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// crioListener serves a socket the way CRI-O does (cmd/crio/main.go, as of
// 1.35): github.com/soheilhy/cmux sits in front of gRPC and hands it a
// connection only when the content-type of the connection's first request
// is exactly "application/grpc"
// (cmux.HTTP2MatchHeaderFieldSendSettings("content-type",
// "application/grpc")). Any other connection is closed, with the client's
// frames still unread, which the client sees as "connection reset by peer".
// Like cmux it answers the client's SETTINGS while it sniffs, so the client
// takes the connection as up before its first call is judged.
type crioListener struct {
	net.Listener
	conns chan net.Conn
	done  chan struct{} // closed when the socket no longer accepts
}

func newCRIOListener(l net.Listener) *crioListener {
	c := &crioListener{Listener: l, conns: make(chan net.Conn), done: make(chan struct{})}
	go c.acceptLoop()
	return c
}

func (c *crioListener) acceptLoop() {
	// Closing the socket (gRPC's Stop and GracefulStop do) ends Accept.
	// Sniffers still reading a connection that made no call end with it.
	defer close(c.done)
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return
		}
		// One goroutine per connection, as cmux: a connection that makes no
		// call (yet) must not hold up the others.
		go c.sniff(conn)
	}
}

func (c *crioListener) sniff(conn net.Conn) {
	var seen bytes.Buffer
	if firstContentType(conn, io.TeeReader(conn, &seen)) != "application/grpc" {
		conn.Close()
		return
	}
	replay := &replayConn{Conn: conn, r: io.MultiReader(&seen, conn)}
	select {
	case c.conns <- replay:
	case <-c.done:
		conn.Close()
	}
}

// Accept returns the connections gRPC may have.
func (c *crioListener) Accept() (net.Conn, error) {
	select {
	case conn := <-c.conns:
		return conn, nil
	case <-c.done:
		return nil, net.ErrClosed
	}
}

// firstContentType reads a client's HTTP/2 preface and frames up to its
// first request's headers and returns that request's content-type ("" if
// the connection is not HTTP/2 or ends first), answering SETTINGS as it
// goes, as cmux's matcher does.
func firstContentType(w io.Writer, r io.Reader) string {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		return ""
	}
	framer := http2.NewFramer(w, r)
	var contentType string
	dec := hpack.NewDecoder(4<<10, func(f hpack.HeaderField) {
		if f.Name == "content-type" {
			contentType = f.Value
		}
	})
	for {
		f, err := framer.ReadFrame()
		if err != nil {
			return ""
		}
		var ended bool
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := framer.WriteSettings(); err != nil {
					return ""
				}
			}
		case *http2.HeadersFrame:
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
				return ""
			}
			ended = f.HeadersEnded()
		case *http2.ContinuationFrame:
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
				return ""
			}
			ended = f.HeadersEnded()
		}
		if ended || contentType != "" {
			return contentType
		}
	}
}

// replayConn gives gRPC the bytes the sniffer read before the rest.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestCallsReachTheRuntimeAsTheKubeletSendsThem checks the content-type of
// every kind of call the proxy makes to the runtime. The kubelet's CRI
// client (grpc-go, no content-subtype) sends "application/grpc"; CRI-O's
// socket serves gRPC only for that value, and judges a whole connection by
// its first call: a call sent as "application/grpc+proto" first on a new
// connection has CRI-O reset the connection, for every call queued on it.
func TestCallsReachTheRuntimeAsTheKubeletSendsThem(t *testing.T) {
	t.Parallel()
	wantsNone := func(*runtimeapi.ImageStatusRequest) bool { return false }
	rig := newProxyRig(t, Options{Interceptors: []Interceptor{
		InterceptFiltered(ImageStatus, passOn[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse], wantsNone),
		Intercept(CreateContainer, passOn[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]),
	}}, false)
	ctx := context.Background()

	for _, tc := range []struct {
		name       string
		fullMethod string
		call       func() error
	}{
		{"a unary call no interceptor is on, forwarded as frames", "/runtime.v1.RuntimeService/Version", func() error {
			_, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"a call an interceptor is on, decoded and sent again", "/runtime.v1.RuntimeService/CreateContainer", func() error {
			_, err := rig.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{})
			return err
		}},
		{"a call every filter declined, forwarded as frames", "/runtime.v1.ImageService/ImageStatus", func() error {
			_, err := rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
			return err
		}},
		{"the secret scrub's PullImage, always decoded", "/runtime.v1.ImageService/PullImage", func() error {
			_, err := rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
			return err
		}},
		{"a stream", "/runtime.v1.RuntimeService/GetContainerEvents", func() error {
			s, err := rig.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
			if err != nil {
				return err
			}
			for {
				if _, err := s.Recv(); err != nil {
					return nil // the fake ends it with Aborted
				}
			}
		}},
		{"a method this build does not know", "/runtime.v1.RuntimeService/FutureMethod", func() error {
			return rig.conn.Invoke(ctx, "/runtime.v1.RuntimeService/FutureMethod", &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"application/grpc"}, rig.runtime.ContentTypes(tc.fullMethod)); diff != "" {
				t.Errorf("content-type at the runtime (-want +got):\n%s", diff)
			}
		})
	}
}

// passOn is a hook that only calls the runtime.
func passOn[Req, Resp any](ctx context.Context, req *Req, next Next[Req, Resp]) (*Resp, error) {
	return next(ctx, req)
}

// TestACRIOLikeSocketServesEveryKindOfCall puts the proxy in front of a
// runtime served as CRI-O serves it. Each case's call is the first on the
// proxy's connection, as the first call after the runtime restarts is.
func TestACRIOLikeSocketServesEveryKindOfCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		call func(ctx context.Context, r *proxyRig) error
	}{
		{"a call forwarded as frames, first on its connection", func(ctx context.Context, r *proxyRig) error {
			_, err := r.rt.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}},
		{"an intercepted call, first on its connection", func(ctx context.Context, r *proxyRig) error {
			_, err := r.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rig := newCRIOLikeRig(t)
			if err := tc.call(context.Background(), rig); err != nil {
				t.Fatalf("through the proxy, in front of a CRI-O-like socket: %v", err)
			}
		})
	}
}

// newCRIOLikeRig is a proxy in front of one fake runtime served through a
// crioListener.
func newCRIOLikeRig(t *testing.T) *proxyRig {
	t.Helper()
	sock := filepath.Join(fakecri.SocketDir(t), "crio.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := fakecri.New("crio")
	srv := f.Server()
	go srv.Serve(newCRIOListener(l))
	t.Cleanup(srv.Stop)
	rig := startProxyRig(t, Options{}, sock, "")
	rig.runtime, rig.image = f, f
	return rig
}
