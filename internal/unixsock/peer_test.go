package unixsock

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// dialEnv, when set to a socket path, makes the test binary a client that
// connects there and waits until the server hangs up: run under other
// credentials, it is another user's process.
const dialEnv = "UNIXSOCK_TEST_DIAL"

// holdEnv, when set, makes the test binary a child that keeps the
// descriptors it inherited open until its stdin closes: what any child is
// for a moment, between fork and exec.
const holdEnv = "UNIXSOCK_TEST_HOLD"

func TestMain(m *testing.M) {
	if os.Getenv(holdEnv) != "" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if path := os.Getenv(dialEnv); path != "" {
		c, err := net.Dial("unix", path)
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		_, _ = io.Copy(io.Discard, c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestPeerOf(t *testing.T) {
	t.Parallel()
	// A directory and socket anyone may reach: only the credentials tell
	// callers apart.
	dir := tempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "peer.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	accept := func(t *testing.T) Peer {
		t.Helper()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p, err := PeerOf(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("the test process itself: its pid, uid and gid", func(t *testing.T) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		p := accept(t)
		if int(p.PID) != os.Getpid() || int(p.UID) != os.Geteuid() || int(p.GID) != os.Getegid() {
			t.Errorf("peer %+v, want pid %d uid %d gid %d", p, os.Getpid(), os.Geteuid(), os.Getegid())
		}
	})

	t.Run("another user's process: its uid, its gid and its supplementary groups", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root to start a process as another user")
		}
		// /proc/self/exe: the test binary, whatever its directory's mode.
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = append(os.Environ(), dialEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65533, Groups: []uint32{4242, 4343}}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := accept(t) // closing the connection lets the child exit
		if err := cmd.Wait(); err != nil {
			t.Fatalf("client: %v", err)
		}
		if p.UID != 65534 || p.GID != 65533 || int(p.PID) != cmd.Process.Pid {
			t.Errorf("peer %+v, want uid 65534 gid 65533 pid %d", p, cmd.Process.Pid)
		}
		for _, g := range []uint32{4242, 4343, 65533} {
			if !p.InGroup(g) {
				t.Errorf("peer %+v is not in group %d", p, g)
			}
		}
		if p.InGroup(0) || slices.Contains(p.Groups, 0) {
			t.Errorf("peer %+v is in root's group", p)
		}
	})

	t.Run("a connection that is not a unix socket has no peer credentials", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if _, err := PeerOf(a); err == nil {
			t.Error("PeerOf(net.Pipe) succeeded")
		}
	})
}
