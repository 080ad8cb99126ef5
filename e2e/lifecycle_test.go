package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestContainerdRestartUnderTheProxy restarts containerd while the proxy
// runs: calls fail meanwhile, as they would without the proxy, readiness
// says so, and the proxy recovers by itself.
func TestContainerdRestartUnderTheProxy(t *testing.T) {
	needRig(t)
	monAddr := freeAddr(t)
	sock := filepath.Join(testRig.Dir, "restart.sock")
	p, err := testRig.StartProxy(proxyBin, sock, "--monitoring-address", monAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(10 * time.Second)
	ep := "unix://" + sock

	if code, body := httpGet(t, monAddr, "/readyz"); code != 200 {
		t.Fatalf("readyz before the restart: %d %s", code, body)
	}
	testRig.StopContainerd()
	defer func() {
		if !testRig.Containerd().Alive() {
			testRig.StartContainerd()
		}
	}()

	res := crictl(t, ep, "version")
	if res.Err == nil {
		t.Fatalf("crictl version succeeded with containerd down")
	}
	if !strings.Contains(res.Stderr, "Unavailable") {
		t.Errorf("with containerd down, want Unavailable:\n%s", res.Stderr)
	}
	if code, body := httpGet(t, monAddr, "/readyz"); code != 503 || !strings.Contains(body, "Version") {
		t.Errorf("readyz with containerd down: %d %q, want 503 naming the failed Version", code, body)
	}
	if _, body := httpGet(t, monAddr, "/metrics"); !strings.Contains(body, "cri_image_proxy_backend_up 0") {
		t.Errorf("backend_up is not 0 with containerd down")
	}

	if err := testRig.StartContainerd(); err != nil {
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

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
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
