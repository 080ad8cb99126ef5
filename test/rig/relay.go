package rig

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// DelayRelay is a TCP relay on 127.0.0.1 that holds every chunk of data
// for delay in each direction: a registry one network hop away (RTT =
// 2 x delay), without leaving loopback, for the bench; or, with a long
// delay, a slow registry whose pulls a test can cut in the middle.
// AddMirror puts it in front of a registry name.
type DelayRelay struct {
	l      net.Listener
	target string
	delay  time.Duration
	served atomic.Int64 // bytes relayed from the target to its clients
	// pipelined delays each chunk from when it was read, not from when the
	// previous one was written: latency without a bandwidth limit.
	pipelined bool
}

// StartDelayRelay relays 127.0.0.1:Port() to target with delay.
func StartDelayRelay(target string, delay time.Duration) (*DelayRelay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &DelayRelay{l: l, target: target, delay: delay}
	go r.serve()
	return r, nil
}

// StartLatencyRelay relays 127.0.0.1:Port() to target, each chunk
// delivered delay after it was read, in order, whatever else is in flight:
// a registry that far away (RTT = 2 x delay) over a link as fast as
// loopback, for pulls of a realistic size, where DelayRelay's one chunk
// at a time would also cap the bandwidth at 64 KiB per delay.
func StartLatencyRelay(target string, delay time.Duration) (*DelayRelay, error) {
	r, err := StartDelayRelay(target, delay)
	if err == nil {
		r.pipelined = true
	}
	return r, err
}

// Port is the relay's port on 127.0.0.1.
func (r *DelayRelay) Port() int { return r.l.Addr().(*net.TCPAddr).Port }

// Served is how many bytes the target sent its clients through the relay.
func (r *DelayRelay) Served() int64 { return r.served.Load() }

// Close stops accepting connections; those open run to their end.
func (r *DelayRelay) Close() { r.l.Close() }

func (r *DelayRelay) serve() {
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			time.Sleep(r.delay) // the SYN's way
			u, err := net.Dial("tcp", r.target)
			if err != nil {
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { r.pump(u, c, nil); done <- struct{}{} }()
			go func() { r.pump(c, u, &r.served); done <- struct{}{} }()
			<-done
		}()
	}
}

// pump copies src to dst, each chunk delayed; order is kept. It counts
// what it copied in count, when set.
func (r *DelayRelay) pump(dst io.Writer, src io.Reader, count *atomic.Int64) {
	if r.pipelined {
		r.pumpPipelined(dst, src, count)
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			time.Sleep(r.delay)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if count != nil {
				count.Add(int64(n))
			}
		}
		if err != nil {
			if c, ok := dst.(interface{ CloseWrite() error }); ok {
				c.CloseWrite()
			}
			return
		}
	}
}

// pumpPipelined is pump with each chunk held for the delay from when it
// was read: a reader queues chunks with their due time, a writer writes
// each when it is due, in order.
func (r *DelayRelay) pumpPipelined(dst io.Writer, src io.Reader, count *atomic.Int64) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 64<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(r.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			for range q { // let the reader end
			}
			return
		}
		if count != nil {
			count.Add(int64(len(c.b)))
		}
	}
	if c, ok := dst.(interface{ CloseWrite() error }); ok {
		c.CloseWrite()
	}
}
