package unixsock

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestListen(t *testing.T) {
	t.Parallel()

	t.Run("the socket gets mode 0660 and the group asked for, in a new directory", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "run", "proxy.sock")
		gid := os.Getgid()
		l, err := Listen(path, Options{Group: strconv.Itoa(gid)})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o660 || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("mode = %v, want a socket with 0660", fi.Mode())
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.Close()
	})

	t.Run("a second instance is refused and told the first one's pid", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		l, err := Listen(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, err = Listen(path, Options{})
		if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
			t.Fatalf("got %v, want an error naming pid %d", err, os.Getpid())
		}
		// The first instance still serves.
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the first instance lost its socket: %v", err)
		}
		c.Close()
	})

	t.Run("a stale socket from a crashed instance is replaced", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		stale, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close() // the file stays, nobody answers: a crash's leftovers
		l, err := Listen(path, Options{})
		if err != nil {
			t.Fatalf("stale socket not replaced: %v", err)
		}
		l.Close()
	})

	t.Run("a socket another process serves on is never taken over", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		foreign, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer foreign.Close()
		if _, err := Listen(path, Options{}); err == nil || !strings.Contains(err.Error(), "another process is serving") {
			t.Fatalf("got %v, want a refusal", err)
		}
	})

	t.Run("a regular file in the way is not removed", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Listen(path, Options{}); err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("got %v, want a refusal", err)
		}
		if b, _ := os.ReadFile(path); string(b) != "data" {
			t.Errorf("the file was changed")
		}
	})

	t.Run("closing removes the socket and frees the lock", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		l, err := Listen(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("socket still there: %v", err)
		}
		l2, err := Listen(path, Options{})
		if err != nil {
			t.Fatalf("relisten: %v", err)
		}
		l2.Close()
	})

	// A child process holds a copy of every descriptor from fork to exec;
	// the kernel keeps a flock while any copy of its descriptor lives.
	// Both cases below hold a copy across Close, as such a child would,
	// but for as long as the test needs instead of by chance.
	t.Run("closing frees the lock while a copy of its descriptor lives on", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		l, err := Listen(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		dup, err := unix.Dup(int(l.lock.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(dup)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := Listen(path, Options{})
		if err != nil {
			t.Fatalf("relisten while a copy of the lock's descriptor is open: %v", err)
		}
		l2.Close()
	})

	t.Run("closing frees the lock while a child process holds its descriptor", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		l, err := Listen(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		child := exec.Command("/proc/self/exe")
		child.Env = append(os.Environ(), holdEnv+"=1")
		child.ExtraFiles = []*os.File{l.lock}
		release, err := child.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		// Start returns once the child has exec'd: it holds the
		// descriptor as its fd 3 until release is closed.
		defer func() {
			release.Close()
			if err := child.Wait(); err != nil {
				t.Errorf("child: %v", err)
			}
		}()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := Listen(path, Options{})
		if err != nil {
			t.Fatalf("relisten while a child holds the lock's descriptor: %v", err)
		}
		l2.Close()
	})

	t.Run("an unknown group is an error that names it", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		if _, err := Listen(path, Options{Group: "no-such-group-xyz"}); err == nil || !strings.Contains(err.Error(), "no-such-group-xyz") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestListenActivated(t *testing.T) {
	t.Parallel()

	t.Run("a socket the service manager passed is taken as it is and outlives Close", func(t *testing.T) {
		path := filepath.Join(tempDir(t), "proxy.sock")
		// What systemd does: it binds and listens, then hands the fd over.
		held, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		f, err := held.(*net.UnixListener).File()
		if err != nil {
			t.Fatal(err)
		}
		passed, err := net.FileListener(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		l, err := Listen(path, Options{Mode: 0o600, Activated: map[string]net.Listener{path: passed}})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Activated {
			t.Error("Listener.Activated is false for a passed socket")
		}
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Close()
			}
		}()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.Close()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		// The manager's socket is still there and still listening: a
		// client connects (it waits in the backlog for the next instance).
		if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Fatalf("the socket file after Close: %v, %v", fi, err)
		}
		c, err = net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial after Close: %v", err)
		}
		c.Close()
		// And the next instance takes the lock again.
		l2, err := Listen(path, Options{Activated: map[string]net.Listener{path: held}})
		if err != nil {
			t.Fatal(err)
		}
		if err := unlockInstance(l2.lock); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a socket passed for another path is left alone", func(t *testing.T) {
		dir := tempDir(t)
		other, err := net.Listen("unix", filepath.Join(dir, "other.sock"))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		path := filepath.Join(dir, "proxy.sock")
		l, err := Listen(path, Options{Activated: map[string]net.Listener{other.Addr().String(): other}})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if l.Activated {
			t.Error("took a socket bound to another path")
		}
	})
}
