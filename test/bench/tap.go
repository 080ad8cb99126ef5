package main

import (
	"context"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// A criTap stands between a kubelet and its CRI endpoint and times every
// call it forwards, as frames it does not decode: what the kubelet waits
// for, per method, on either arm of the storm. Both arms go through a tap
// of their own, so its small cost is on both sides of a ratio; the time
// taken is the upstream's alone (from the request's arrival to the
// upstream's answer), not the kubelet-to-tap hop.
type criTap struct {
	server   *grpc.Server
	upstream *grpc.ClientConn

	mu    sync.Mutex
	calls []tappedCall
}

// tappedCall is one forwarded unary call.
type tappedCall struct {
	method string
	start  time.Time
	took   time.Duration
	// request is the call's first message as it came (empty if none
	// came): what pairs a call with the one the proxy made for it.
	request string
}

// rawFrames is a codec that hands a message's bytes on as they came.
type rawFrames struct{}

func (rawFrames) Marshal(v any) ([]byte, error)   { return *(v.(*[]byte)), nil }
func (rawFrames) Unmarshal(b []byte, v any) error { *(v.(*[]byte)) = slices.Clone(b); return nil }
func (rawFrames) Name() string                    { return "proto" }

var _ encoding.Codec = rawFrames{}

// startTap listens on socket and forwards to the CRI endpoint upstream.
func startTap(socket, upstream string) (*criTap, error) {
	cc, err := rig.DialCRI(upstream)
	if err != nil {
		return nil, err
	}
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		cc.Close()
		return nil, err
	}
	t := &criTap{upstream: cc}
	//nolint:staticcheck // ForceServerCodec is what a frame-forwarding server needs.
	t.server = grpc.NewServer(grpc.ForceServerCodec(rawFrames{}), grpc.UnknownServiceHandler(t.forward),
		grpc.MaxRecvMsgSize(criproxy.MaxMessageSize), grpc.MaxSendMsgSize(criproxy.MaxMessageSize))
	go t.server.Serve(l)
	return t, nil
}

// forward relays one call, as a stream of frames either way (a unary
// call is a stream of one each way), with the caller's metadata (the
// containerd API names its namespace in it); it is timed from the
// request's arrival to the upstream's end.
func (t *criTap) forward(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	ctx := ss.Context()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		out := metadata.MD{}
		for k, v := range md {
			if !strings.HasPrefix(k, ":") && !strings.HasPrefix(k, "grpc-") && k != "content-type" && k != "user-agent" && k != "te" {
				out[k] = v
			}
		}
		ctx = metadata.NewOutgoingContext(ctx, out)
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := t.upstream.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodec(rawFrames{}))
	if err != nil {
		return err
	}
	var request atomic.Pointer[[]byte]
	go func() {
		for {
			var in []byte
			if err := ss.RecvMsg(&in); err != nil {
				if err == io.EOF {
					cs.CloseSend()
				} else {
					cancel()
				}
				return
			}
			request.CompareAndSwap(nil, &in)
			if cs.SendMsg(&in) != nil {
				return
			}
		}
	}()
	for first := true; ; first = false {
		var out []byte
		err := cs.RecvMsg(&out)
		if err != nil {
			var req string
			if r := request.Load(); r != nil {
				req = string(*r)
			}
			t.record(method, start, req)
			if err == io.EOF {
				ss.SetTrailer(cs.Trailer())
				return nil
			}
			return err
		}
		if first {
			if h, herr := cs.Header(); herr == nil {
				ss.SetHeader(h)
			}
		}
		if err := ss.SendMsg(&out); err != nil {
			return err
		}
	}
}

// record notes a call of method that began at start and ends now,
// answered or failed alike.
func (t *criTap) record(method string, start time.Time, request string) {
	took := time.Since(start)
	t.mu.Lock()
	t.calls = append(t.calls, tappedCall{method: method, start: start, took: took, request: request})
	t.mu.Unlock()
}

// counts returns how many calls of each method (its last path element)
// began in [from, to).
func (t *criTap) counts(from, to time.Time) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, c := range t.calls {
		if !c.start.Before(from) && c.start.Before(to) {
			out[path(c.method)]++
		}
	}
	return out
}

// between returns the durations of the calls of method (its last path
// element, e.g. "ImageStatus") that began in [from, to).
func (t *criTap) between(method string, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, c := range t.callsOf(method, from, to) {
		out = append(out, c.took)
	}
	return out
}

// callsOf returns the calls of method that began in [from, to).
func (t *criTap) callsOf(method string, from, to time.Time) []tappedCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []tappedCall
	for _, c := range t.calls {
		if !c.start.Before(from) && c.start.Before(to) && path(c.method) == method {
			out = append(out, c)
		}
	}
	return out
}

// forget drops what the tap has timed so far.
func (t *criTap) forget() {
	t.mu.Lock()
	t.calls = nil
	t.mu.Unlock()
}

func (t *criTap) stop() {
	t.server.Stop()
	t.upstream.Close()
}

func path(method string) string {
	for i := len(method) - 1; i >= 0; i-- {
		if method[i] == '/' {
			return method[i+1:]
		}
	}
	return method
}
