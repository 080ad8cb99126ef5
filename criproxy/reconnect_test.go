package criproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// The test binary serves a fake runtime when helperRuntimeEnv names a
// socket (TestMain), so that a test can kill a runtime as a crash does.
const (
	helperRuntimeEnv     = "CRIPROXY_TEST_RUNTIME_SOCKET"
	helperRuntimeNameEnv = "CRIPROXY_TEST_RUNTIME_NAME"
	helperRuntimeCRIOEnv = "CRIPROXY_TEST_RUNTIME_CRIO" // serve like CRI-O's socket
)

// streamDesc makes a call of any kind a stream.
var streamDesc = grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// runHelperRuntime serves a fake runtime on sock as CRI-O does: a socket
// left behind by a killed instance is removed first, and SIGTERM stops it
// gracefully (a GOAWAY, the socket removed). It prints a line once it
// listens, and returns the exit code.
func runHelperRuntime(sock string) int {
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// It holds the image x under an ID of its name: an answer says which
	// instance gave it.
	name := os.Getenv(helperRuntimeNameEnv)
	srv := fakecri.New(name, fakecri.Image("sha256:"+name, "x")).Server()
	var lis net.Listener = l
	if os.Getenv(helperRuntimeCRIOEnv) != "" {
		lis = newCRIOListener(l)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() {
		<-sig
		srv.GracefulStop()
	}()
	fmt.Println("serving")
	if err := srv.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childRuntime is a fake runtime in a child process at a fixed socket
// path, which the test stops (SIGTERM) or kills (SIGKILL) and starts again.
type childRuntime struct {
	t      *testing.T
	path   string
	crio   bool
	starts int

	cmd    *exec.Cmd
	stderr bytes.Buffer
}

// name is what the current instance answers as RuntimeName (and in the ID
// of its image x).
func (c *childRuntime) name() string { return fmt.Sprintf("child-%d", c.starts) }

// start starts a new instance and returns once it listens.
func (c *childRuntime) start() {
	t := c.t
	t.Helper()
	c.starts++
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), helperRuntimeEnv+"="+c.path, helperRuntimeNameEnv+"="+c.name())
	if c.crio {
		c.cmd.Env = append(c.cmd.Env, helperRuntimeCRIOEnv+"=1")
	}
	c.stderr.Reset()
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := c.cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	serving := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		serving <- line == "serving\n"
	}()
	select {
	case ok := <-serving:
		if !ok {
			cmd.Wait()
			t.Fatalf("the runtime in a child process did not start: %s", c.stderr.String())
		}
	case <-time.After(time.Minute): // a bound, not an assertion
		t.Fatalf("the runtime in a child process did not listen within a minute: %s", c.stderr.String())
	}
}

// stop ends the current instance with sig and waits for it to exit.
func (c *childRuntime) stop(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
	err := c.cmd.Wait()
	if sig == syscall.SIGTERM && err != nil {
		c.t.Fatalf("the runtime did not stop gracefully: %v: %s", err, c.stderr.String())
	}
}

// logRecords is a slog.Handler that keeps the records' messages and
// endpoints, for tests.
type logRecords struct {
	mu      sync.Mutex
	records []string // "message endpoint"
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }

func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	endpoint := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "endpoint" {
			endpoint = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Message+" "+endpoint)
	return nil
}

// count returns how many records start with msg and name endpoint.
func (l *logRecords) count(msg, endpoint string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if strings.HasPrefix(r, msg) && strings.HasSuffix(r, " "+endpoint) {
			n++
		}
	}
	return n
}

func (l *logRecords) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.records, "\n")
}

// waitFor calls f until it returns nil, and fails the test with what for
// and f's last error if that takes longer than a minute. The minute is a
// bound for a loaded machine, not an expectation: reconnecting takes at
// most a few seconds.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s; last: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTheProxyReconnectsAfterTheRuntimeRestarts takes a runtime away, in
// a child process, the ways it goes away on a node, and brings it back at
// the same socket: calls fail with Unavailable naming it while it is away,
// readiness says so, the log says it once, and calls are served again
// once it is back, without restarting the proxy.
func TestTheProxyReconnectsAfterTheRuntimeRestarts(t *testing.T) {
	t.Parallel()
	type restart struct {
		name  string
		image bool           // the separate image endpoint goes away, not the runtime's
		crio  bool           // served as CRI-O serves its socket
		sig   syscall.Signal // SIGTERM: stopped gracefully; SIGKILL: killed, its socket left behind
		away  time.Duration  // how long it stays away once calls fail
	}
	var cases []restart
	for _, image := range []bool{false, true} {
		for _, crio := range []bool{false, true} {
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
				name := "the runtime"
				if image {
					name = "a separate image endpoint"
				}
				if crio {
					name += " served like CRI-O"
				}
				if sig == syscall.SIGTERM {
					name += ", stopped gracefully,"
				} else {
					name += ", killed with SIGKILL,"
				}
				cases = append(cases, restart{name: name + " is served again once it is back", image: image, crio: crio, sig: sig})
			}
		}
	}
	// Longer than the longest backoff between connection attempts (2s).
	cases = append(cases, restart{name: "the runtime served like CRI-O, killed and away for three seconds, is served again once it is back",
		crio: true, sig: syscall.SIGKILL, away: 3 * time.Second})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := fakecri.SocketDir(t)
			child := &childRuntime{t: t, crio: tc.crio}
			runtimeSock, imageSock := filepath.Join(dir, "rt.sock"), filepath.Join(dir, "img.sock")
			if tc.image {
				child.path = imageSock
				fakecri.New("runtime").Serve(t, runtimeSock)
			} else {
				child.path = runtimeSock
				fakecri.New("image").Serve(t, imageSock)
			}
			child.start()
			rig := startProxyRig(t, Options{Interceptors: []Interceptor{
				Intercept(CreateContainer, passOn[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]),
			}}, runtimeSock, "unix://"+imageSock)
			logs := &logRecords{}
			ctx, cancel := context.WithCancel(context.Background())
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				rig.backend.Watch(ctx, slog.New(logs))
			}()
			t.Cleanup(func() { cancel(); <-watched })
			endpoint, other := "unix://"+child.path, rig.backend.ImageEndpoint
			if tc.image {
				other = rig.backend.RuntimeEndpoint
			}

			// forwarded is a call the kubelet makes that the proxy forwards
			// as frames; it returns the name of the runtime that answered.
			forwarded := func() (string, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if tc.image {
					st, err := rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
					return strings.TrimPrefix(st.GetImage().GetId(), "sha256:"), err
				}
				v, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
				return v.GetRuntimeName(), err
			}
			// others are the other kinds of calls: intercepted, and a stream.
			others := map[string]func() error{
				"an intercepted call": func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if tc.image {
						_, err := rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "x"}})
						return err
					}
					_, err := rig.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{})
					return err
				},
				"a stream": func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					method := "/runtime.v1.RuntimeService/GetContainerEvents"
					if tc.image {
						method = "/runtime.v1.ImageService/FutureImageStream" // echoed by the fake
					}
					s, err := rig.conn.NewStream(ctx, &streamDesc, method)
					if err != nil {
						return err
					}
					// io.EOF: the stream has ended already; RecvMsg says how.
					if err := s.SendMsg(&runtimeapi.GetEventsRequest{}); err != nil && !errors.Is(err, io.EOF) {
						return err
					}
					if err := s.CloseSend(); err != nil {
						return err
					}
					for {
						if err := s.RecvMsg(&runtimeapi.ContainerEventResponse{}); err != nil {
							if errors.Is(err, io.EOF) || status.Code(err) == codes.Aborted {
								return nil // the fake's GetContainerEvents ends with Aborted
							}
							return err
						}
					}
				},
			}
			ready := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				return rig.backend.Ready(ctx)
			}

			if name, err := forwarded(); err != nil || name != child.name() {
				t.Fatalf("before the restart: answered by %q (%v), want %s", name, err, child.name())
			}
			for what, call := range others {
				if err := call(); err != nil {
					t.Fatalf("before the restart, %s: %v", what, err)
				}
			}
			if err := ready(); err != nil {
				t.Fatalf("not ready before the restart: %v", err)
			}

			child.stop(tc.sig)
			waitFor(t, "calls to fail with Unavailable naming the endpoint that is away", func() error {
				_, err := forwarded()
				if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), endpoint+" is away") {
					return fmt.Errorf("got %v, want Unavailable saying %s is away", err, endpoint)
				}
				return nil
			})
			for what, call := range others {
				if err := call(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), endpoint+" is away") {
					t.Errorf("while it is away, %s: got %v, want Unavailable saying %s is away", what, err, endpoint)
				}
			}
			waitFor(t, "readiness to fail naming the endpoint", func() error {
				if err := ready(); err == nil || !strings.Contains(err.Error(), endpoint) {
					return fmt.Errorf("ready: %v", err)
				}
				return nil
			})
			time.Sleep(tc.away) // part of the scenario, not an assertion

			child.start()
			// The forwarded call first: on a CRI-O socket the first call on
			// a connection decides what becomes of it.
			waitFor(t, "the restarted runtime to answer the forwarded call", func() error {
				name, err := forwarded()
				if err != nil {
					return err
				}
				if name != child.name() {
					t.Fatalf("after the restart: answered by %q, want %s", name, child.name())
				}
				return nil
			})
			for what, call := range others {
				if err := call(); err != nil {
					t.Errorf("after the restart, %s: %v", what, err)
				}
			}
			waitFor(t, "readiness to be back", ready)
			waitFor(t, "the log to say the runtime is back", func() error {
				if logs.count("the runtime is back", endpoint) == 0 {
					return fmt.Errorf("log:\n%s", logs)
				}
				return nil
			})
			if away, back := logs.count("the runtime is away", endpoint), logs.count("the runtime is back", endpoint); away != 1 || back != 1 {
				t.Errorf("the log says %d times that %s is away and %d times that it is back, want once each:\n%s", away, endpoint, back, logs)
			}
			if n := logs.count("the runtime is away", other); n != 0 {
				t.Errorf("the log says %d times that %s, which stayed, is away:\n%s", n, other, logs)
			}
		})
	}
}

// TestARuntimesOwnUnavailablePassesAsItCame checks that only a call that
// failed for want of a connection is said to find the runtime away, on
// every path, including the first calls on a new connection (gRPC says
// the connection is up only after it has carried them).
func TestARuntimesOwnUnavailablePassesAsItCame(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		method string // the runtime answers it with its own Unavailable
		call   func(ctx context.Context, r *proxyRig) error
	}{
		{"a call forwarded as frames", "RemoveImage", func(ctx context.Context, r *proxyRig) error {
			_, err := r.img.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: "app"}})
			return err
		}},
		{"an intercepted call", "PullImage", func(ctx context.Context, r *proxyRig) error {
			_, err := r.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "app"}})
			return err
		}},
		{"a stream", "/runtime.v1.RuntimeService/FutureUnavailable", func(ctx context.Context, r *proxyRig) error {
			s, err := r.conn.NewStream(ctx, &streamDesc, "/runtime.v1.RuntimeService/FutureUnavailable")
			if err != nil {
				return err
			}
			if err := s.CloseSend(); err != nil {
				return err
			}
			return s.RecvMsg(&runtimeapi.VersionResponse{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rig := newProxyRig(t, Options{}, false) // each case's call is the first on its connection
			rig.runtime.Fail(tc.method, busy)
			err := tc.call(context.Background(), rig)
			if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "runtime says: busy" {
				t.Errorf("got %v, want the runtime's Unavailable as it came", err)
			}
		})
	}
}

// TestACallThatFailedBeforeTheRuntimeCameBackSaysNothingNew: a call made
// while the runtime was away can fail after the log said it is back (the
// call was on the connection that was away); that failure is no news, and
// the log does not say the runtime is away again. A call that began after
// the runtime came back and fails for want of a connection is news.
func TestACallThatFailedBeforeTheRuntimeCameBackSaysNothingNew(t *testing.T) {
	t.Parallel()
	const endpoint = "unix:///run/runtime.sock"
	cc, err := grpc.NewClient("passthrough:///runtime", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	logs := &logRecords{}
	l := &link{cc: cc, role: "runtime", endpoint: endpoint, log: slog.New(logs)}
	note := func(f func()) { l.mu.Lock(); defer l.mu.Unlock(); f() }
	noConnection := status.Error(codes.Unavailable, "connection error")

	note(l.upLocked)
	note(l.awayLocked)
	began := l.ups.Load() // a call while it is away
	note(l.upLocked)
	if err := l.explainAway(noConnection, began); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), endpoint+" is away") {
		t.Errorf("the call's own error: got %v, want Unavailable saying %s is away", err, endpoint)
	}
	if away, back := logs.count("the runtime is away", endpoint), logs.count("the runtime is back", endpoint); away != 1 || back != 1 {
		t.Fatalf("after a late failure of a call made while away: the log says away %d times and back %d times, want once each:\n%s", away, back, logs)
	}

	if err := l.explainAway(noConnection, l.ups.Load()); status.Code(err) != codes.Unavailable {
		t.Errorf("a call made after it came back: got %v", err)
	}
	if away := logs.count("the runtime is away", endpoint); away != 2 {
		t.Errorf("a call made after the runtime came back failed for want of a connection: the log says away %d times, want 2:\n%s", away, logs)
	}
}
