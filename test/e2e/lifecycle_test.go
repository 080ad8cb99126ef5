package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestRuntimeRestartUnderTheProxy restarts the runtime (containerd or
// CRI-O) while the proxy runs: calls fail meanwhile, as they would without
// the proxy, readiness says so, and the proxy recovers by itself.
func TestRuntimeRestartUnderTheProxy(t *testing.T) {
	needRig(t)
	monAddr := freeAddr(t)
	ep, p := startProxy(t, "restart", "--monitoring-address", monAddr)

	if code, body := httpGet(t, monAddr, "/readyz"); code != 200 {
		t.Fatalf("readyz before the restart: %d %s", code, body)
	}
	testRig.StopRuntime()
	defer func() {
		if !testRig.RuntimeProc().Alive() {
			testRig.StartRuntime()
		}
	}()

	res := crictl(t, ep, "version")
	if res.Err == nil {
		t.Fatalf("crictl version succeeded with %s down", testRig.Runtime.Name)
	}
	if !strings.Contains(res.Stderr, "Unavailable") {
		t.Errorf("with %s down, want Unavailable:\n%s", testRig.Runtime.Name, res.Stderr)
	}
	if code, body := httpGet(t, monAddr, "/readyz"); code != 503 || !strings.Contains(body, "Version") {
		t.Errorf("readyz with %s down: %d %q, want 503 naming the failed Version", testRig.Runtime.Name, code, body)
	}
	if _, body := httpGet(t, monAddr, "/metrics"); !strings.Contains(body, "cri_image_proxy_backend_up 0") {
		t.Errorf("backend_up is not 0 with %s down", testRig.Runtime.Name)
	}

	if err := testRig.StartRuntime(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() error {
		if r := crictl(t, ep, "version"); r.Err != nil {
			return fmt.Errorf("%v: %s", r.Err, r.Stderr)
		}
		return nil
	})
	if !p.Alive() {
		t.Fatalf("the proxy exited")
	}
	if code, _ := httpGet(t, monAddr, "/readyz"); code != 200 {
		t.Errorf("readyz after the restart: %d", code)
	}
	_, metrics := httpGet(t, monAddr, "/metrics")
	for _, want := range []string{
		"cri_image_proxy_backend_up 1",
		`cri_image_proxy_requests_total{code="Unavailable",method="Version",service="runtime.v1.RuntimeService"}`,
		`cri_image_proxy_requests_total{code="OK",method="Version",service="runtime.v1.RuntimeService"}`,
		`cri_image_proxy_request_duration_seconds_bucket{method="Version",service="runtime.v1.RuntimeService"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestProxyProcessLifecycle checks the socket contract of the daemon.
func TestProxyProcessLifecycle(t *testing.T) {
	needRig(t)
	sock := filepath.Join(testRig.Dir, "run", "lifecycle", "proxy.sock") // a directory to create
	p, err := testRig.StartProxy(proxyBin, sock, "--socket-group", "0")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(10 * time.Second)

	t.Run("the socket is created with mode 0660 in a new directory", func(t *testing.T) {
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o660 {
			t.Errorf("mode %v, want 0660", fi.Mode().Perm())
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Gid != 0 {
			t.Errorf("group %d, want 0", st.Gid)
		}
	})

	t.Run("a second instance on the same socket refuses to start and names the first", func(t *testing.T) {
		second, err := testRig.RunProxy(proxyBin, sock)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-second.Exited():
		case <-time.After(30 * time.Second):
			second.Kill()
			t.Fatal("a second proxy kept running on a live socket")
		}
		if second.ExitCode() == 0 {
			t.Errorf("the second instance exited 0")
		}
		if log := second.LogText(); !strings.Contains(log, fmt.Sprintf("another instance (pid %d)", p.Pid())) {
			t.Errorf("second instance's log does not name the first:\n%s", log)
		}
		if r := crictl(t, "unix://"+sock, "version"); r.Err != nil {
			t.Errorf("the first instance stopped serving: %v", r.Stderr)
		}
	})

	t.Run("SIGTERM stops it cleanly: exit 0, socket removed", func(t *testing.T) {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Exited():
		case <-time.After(30 * time.Second):
			t.Fatal("the proxy did not exit on SIGTERM")
		}
		if code := p.ExitCode(); code != 0 {
			t.Errorf("exit code %d\n%s", code, p.LogText())
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket left behind: %v", err)
		}
	})

	t.Run("after a crash (SIGKILL) the next instance replaces the stale socket", func(t *testing.T) {
		crashed, err := testRig.StartProxy(proxyBin, sock)
		if err != nil {
			t.Fatal(err)
		}
		crashed.Kill()
		if _, err := os.Stat(sock); err != nil {
			t.Fatalf("a SIGKILLed proxy should leave its socket: %v", err)
		}
		next, err := testRig.StartProxy(proxyBin, sock)
		if err != nil {
			t.Fatalf("restart after a crash: %v", err)
		}
		next.Stop(10 * time.Second)
	})
}

// freeAddr is an address on 127.0.0.1 that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := rig.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSystemdNotify runs the proxy as systemd runs a Type=notify unit: it
// says READY=1 once its socket accepts calls (a call made right then
// succeeds), and STOPPING=1 on SIGTERM.
func TestSystemdNotify(t *testing.T) {
	needRig(t)
	notify := filepath.Join(testRig.Dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", notify) // the proxy's environment, as systemd sets it
	sock := filepath.Join(testRig.Dir, "notify-proxy.sock")
	p, err := testRig.RunProxy(proxyBin, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(10 * time.Second)
	next := func() string {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 4096)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notification from the proxy: %v\n%s", err, p.LogText())
		}
		return string(buf[:n])
	}
	if msg := next(); msg != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", msg)
	}
	if r := crictl(t, "unix://"+sock, "version"); r.Err != nil {
		t.Errorf("a call right after READY=1: %v\n%s", r.Err, r.Stderr)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if msg := next(); msg != "STOPPING=1" {
		t.Errorf("notification on SIGTERM %q, want STOPPING=1", msg)
	}
}

// TestSocketActivationKeepsCallsAcrossARestart plays systemd's part of
// cri-image-proxy.socket: the test binds and listens on the CRI socket and
// passes it to the proxy as systemd does (fd 3, LISTEN_FDS=1, LISTEN_PID
// the proxy's own pid). The proxy serves on it, leaves it in place when it
// stops, and a call made while no proxy runs waits in the backlog and is
// answered by the next instance, where without activation it would fail.
func TestSocketActivationKeepsCallsAcrossARestart(t *testing.T) {
	needRig(t)
	path := filepath.Join(testRig.Dir, "activated.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ep := "unix://" + path

	start := func(n int) *exec.Cmd {
		t.Helper()
		log, err := os.Create(filepath.Join(testRig.Dir, fmt.Sprintf("activated-proxy-%d.log", n)))
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		// sh sets LISTEN_PID to its pid and exec keeps it: systemd sets it
		// between fork and exec, which os/exec cannot.
		cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=cri-image-proxy.socket exec "$0" "$@"`,
			proxyBin, "serve", "--socket", path, "--runtime-endpoint", direct(), "--monitoring-address", "-", "--log-level", "info")
		cmd.ExtraFiles = []*os.File{held}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	stop := func(cmd *exec.Cmd) {
		t.Helper()
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("the proxy exited with %v on SIGTERM", err)
		}
	}

	first := start(1)
	if r := crictl(t, ep, "version"); r.Err != nil {
		stop(first)
		t.Fatalf("version through the activated socket: %v\n%s", r.Err, r.Stderr)
	}
	stop(first)
	log, _ := os.ReadFile(filepath.Join(testRig.Dir, "activated-proxy-1.log"))
	if !strings.Contains(string(log), "socket activation") {
		t.Errorf("the proxy did not say it serves systemd's socket:\n%s", log)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the socket after the proxy stopped: %v %v", fi, err)
	}

	// A call while no proxy runs: it connects and waits in the backlog of
	// the socket, which ss shows as the listener's receive queue.
	pending := make(chan rig.Result, 1)
	go func() { pending <- crictl(t, ep, "--timeout=2m", "version") }()
	waitUntil(t, time.Minute, func() error {
		select {
		case r := <-pending:
			t.Fatalf("a call with no proxy running returned: %v %s", r.Err, r.Stderr)
		default:
		}
		out, err := exec.Command("ss", "-xlnH", "src", path).CombinedOutput()
		if f := strings.Fields(string(out)); err != nil || len(f) < 3 || f[2] == "0" {
			return fmt.Errorf("no connection waiting on %s: %v %q", path, err, out)
		}
		return nil
	})
	second := start(2)
	defer stop(second)
	if r := <-pending; r.Err != nil || !strings.Contains(r.Stdout, "RuntimeName") {
		t.Fatalf("the call made during the restart: %v\n%s%s", r.Err, r.Stdout, r.Stderr)
	}
}
