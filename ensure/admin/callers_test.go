package admin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

// getEnv, when set to an admin socket path, makes the test binary a
// records client that lists the records there and prints the answer's
// status code and body: run under other credentials, it is another user
// calling the admin socket.
const getEnv = "ADMIN_TEST_GET"

func TestMain(m *testing.M) {
	if path := os.Getenv(getEnv); path != "" {
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}}
		resp, err := c.Get("http://admin/v1/records")
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d %s", resp.StatusCode, body)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestCallersAreRootAndTheAdminGroup(t *testing.T) {
	t.Parallel()
	const admins = 4242
	for _, tc := range []struct {
		name    string
		callers admin.Callers
		peer    unixsock.Peer
		want    bool
	}{
		{"root is allowed without an admin group", admin.Callers{}, unixsock.Peer{UID: 0, GID: 0}, true},
		{"root is allowed whatever its group", admin.Callers{Group: admins, HasGroup: true}, unixsock.Peer{UID: 0, GID: 1000}, true},
		{"a user is refused without an admin group", admin.Callers{}, unixsock.Peer{UID: 1000, GID: 1000}, false},
		{"a user in root's group is refused without an admin group (the zero value is root only)", admin.Callers{}, unixsock.Peer{UID: 1000, GID: 0, Groups: []uint32{0}}, false},
		{"a user whose group is the admin group is allowed", admin.Callers{Group: admins, HasGroup: true}, unixsock.Peer{UID: 1000, GID: admins}, true},
		{"a user with the admin group among its supplementary groups is allowed", admin.Callers{Group: admins, HasGroup: true}, unixsock.Peer{UID: 1000, GID: 1000, Groups: []uint32{27, admins}}, true},
		{"a user outside the admin group is refused", admin.Callers{Group: admins, HasGroup: true}, unixsock.Peer{UID: 1000, GID: 1000, Groups: []uint32{27, 100}}, false},
		{"the admin group may be root's group", admin.Callers{Group: 0, HasGroup: true}, unixsock.Peer{UID: 1000, GID: 1000, Groups: []uint32{0}}, true},
	} {
		if got := tc.callers.Allows(tc.peer); got != tc.want {
			t.Errorf("%s: Allows(%+v) = %v, want %v", tc.name, tc.peer, got, tc.want)
		}
	}
}

// TestTheAdminSocketChecksWhoCallsWhateverItsMode serves the admin API on
// a socket anyone may open (mode 0666, as a service manager could make
// it) and calls it as root, as another user, and as another user in the
// admin group.
func TestTheAdminSocketChecksWhoCallsWhateverItsMode(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to call as another user")
	}
	const admins = 4242
	dir, err := os.MkdirTemp("", "admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	store, err := records.Open(filepath.Join(dir, "ensure.db"), records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	path := filepath.Join(dir, "admin.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	// The log goes to a file: the server writes it while the test reads.
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	srv := admin.NewServer(&admin.Local{Store: store}, admin.Callers{Group: admins, HasGroup: true}, slog.New(slog.NewTextHandler(logFile, nil)))
	go srv.Serve(l)
	defer srv.Close()

	call := func(t *testing.T, cred *syscall.Credential) (int, string) {
		t.Helper()
		cmd := exec.Command("/proc/self/exe") // the test binary, whatever its directory's mode
		cmd.Env = append(os.Environ(), getEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		var code int
		var body string
		if _, err := fmt.Sscanf(string(out), "%d", &code); err != nil {
			t.Fatalf("client printed %q", out)
		}
		_, body, _ = strings.Cut(string(out), " ")
		return code, body
	}

	t.Run("root is served", func(t *testing.T) {
		if code, body := call(t, nil); code != http.StatusOK {
			t.Errorf("root: %d %s", code, body)
		}
	})
	t.Run("another user is refused with 403, told why, and logged by uid and gid", func(t *testing.T) {
		code, body := call(t, &syscall.Credential{Uid: 65534, Gid: 65533, Groups: []uint32{100}})
		if code != http.StatusForbidden || !strings.Contains(body, "uid 65534, gid 65533") {
			t.Errorf("uid 65534: %d %q, want 403 naming the caller", code, body)
		}
		if log, _ := os.ReadFile(logFile.Name()); !strings.Contains(string(log), "caller refused") || !strings.Contains(string(log), "uid=65534 gid=65533") {
			t.Errorf("log %q has no refusal naming uid 65534 and gid 65533", log)
		}
	})
	t.Run("another user in the admin group is served", func(t *testing.T) {
		if code, body := call(t, &syscall.Credential{Uid: 65534, Gid: 65533, Groups: []uint32{100, admins}}); code != http.StatusOK {
			t.Errorf("uid 65534 in group %d: %d %s", admins, code, body)
		}
	})
}
