package unixsock

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// Options say who may use the socket.
type Options struct {
	// Mode of the socket file; 0 means 0660.
	Mode os.FileMode
	// Group owning the socket file, a name or a numeric GID; empty keeps the
	// process's group.
	Group string
	// Activated are the sockets the service manager passed (Activated): if
	// one is bound to the path, Listen takes it instead of making a socket,
	// and leaves the file, its mode and its group to the manager.
	Activated map[string]net.Listener
}

// Listener is a unix socket listener that also holds the instance lock.
// Closing it removes the socket (unless the service manager owns it) and
// releases the lock.
type Listener struct {
	net.Listener
	lock *os.File
	// Activated says the service manager passed the socket: it keeps it,
	// and the connections that arrive while we are away, across a restart.
	Activated bool
}

// Activated returns the unix sockets the service manager passed (systemd
// socket activation: LISTEN_PID, LISTEN_FDS), by the path they are bound
// to, and unsets those variables so that no child inherits them. It can be
// called once; with nothing passed it returns an empty map.
func Activated() (map[string]net.Listener, error) {
	ls, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("sockets passed by the service manager: %w", err)
	}
	out := map[string]net.Listener{}
	for i, l := range ls {
		if l == nil {
			return nil, fmt.Errorf("socket passed by the service manager, file descriptor %d: not a listening stream socket", 3+i)
		}
		if _, ok := l.Addr().(*net.UnixAddr); !ok || !filepath.IsAbs(l.Addr().String()) {
			l.Close()
			return nil, fmt.Errorf("socket passed by the service manager, file descriptor %d: %s %q is not a unix socket path", 3+i, l.Addr().Network(), l.Addr())
		}
		out[l.Addr().String()] = l
	}
	return out, nil
}

// Close stops listening, removes the socket file and releases the lock.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	if lerr := unlockInstance(l.lock); err == nil {
		err = lerr
	}
	return err
}

// Listen prepares path and listens on it. The parent directory is created
// (mode 0755) when missing.
func Listen(path string, opts Options) (*Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("socket %q: the path must be absolute", path)
	}
	mode := opts.Mode
	if mode == 0 {
		mode = 0o660
	}
	gid := -1
	if opts.Group != "" {
		var err error
		if gid, err = LookupGroup(opts.Group); err != nil {
			return nil, fmt.Errorf("socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}

	lock, err := lockInstance(path + ".lock")
	if err != nil {
		return nil, err
	}
	if l, ok := opts.Activated[path]; ok {
		// A listener from a file descriptor does not unlink on Close.
		return &Listener{Listener: l, lock: lock, Activated: true}, nil
	}
	l, err := listen(path, mode, gid)
	if err != nil {
		_ = unlockInstance(lock)
		return nil, err
	}
	return &Listener{Listener: l, lock: lock}, nil
}

// lockInstance takes the instance lock and writes our PID into it.
func lockInstance(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("instance lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another instance (pid %s) holds %s: stop it first", strings.TrimSpace(string(pid)), path)
		}
		return nil, fmt.Errorf("instance lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// unlockInstance releases the instance lock, then closes its file.
//
// Closing alone is not enough. A flock belongs to the open file
// description, not to the descriptor, and close releases it only when the
// last descriptor of that description goes. Any process this one starts
// holds a copy of every descriptor from fork until exec closes the
// close-on-exec ones (Go's os/exec included), and a child that is slow to
// reach exec (a loaded machine, credentials to set) would keep the lock
// held after Close: the next Listen on the same path, in this process or
// a restarted one, would be refused as "another instance". LOCK_UN
// releases the lock for every copy at once.
func unlockInstance(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_UN)
	if err != nil {
		err = fmt.Errorf("instance lock %s: unlock: %w", f.Name(), err)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// listen removes a stale socket file and listens. The socket is created in
// a private mode and opened up only once it has its owner and mode, so no
// one connects in between.
func listen(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("socket %s: set group: %w", path, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: set mode: %w", path, err)
	}
	return l, nil
}

// removeStale removes path if it is a socket nobody answers on. We hold the
// instance lock, so it can only be a crashed instance's or a foreign
// process's; the latter is refused.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("socket %s: exists and is not a socket; not removing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("socket %s: another process is serving on it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("socket %s: remove stale socket: %w", path, err)
	}
	return nil
}

// LookupGroup resolves a group name or numeric GID.
func LookupGroup(group string) (int, error) {
	if gid, err := strconv.Atoi(group); err == nil {
		if gid < 0 || gid >= math.MaxUint32 { // (gid_t)-1 means "no change" to chown
			return 0, fmt.Errorf("group %q: a GID is between 0 and %d", group, uint32(math.MaxUint32-1))
		}
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}
