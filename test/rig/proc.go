package rig

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a daemon the rig started, with its output in a log file.
type Proc struct {
	Name string
	Log  string // path of the log file
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProc starts argv in its own process group (so a terminal's Ctrl-C
// reaches the rig first, which stops it in order), output to logPath.
func StartProc(name, logPath string, env []string, argv ...string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logf.Close() // the child has its own copy
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Alive reports whether the process is still running.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Exited returns a channel closed when the process exits.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// ExitCode is the exit status once the process has exited (-1 when killed
// by a signal).
func (p *Proc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to timeout, then SIGKILLs the group.
func (p *Proc) Stop(timeout time.Duration) {
	if !p.Alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.Kill()
	}
}

// Kill SIGKILLs the process group, as a crash would end it, and waits.
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// LogText returns the log so far.
func (p *Proc) LogText() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// WaitFor polls check every 50ms until it succeeds, p dies or timeout
// passes. The error says which, with the last check error.
func WaitFor(what string, p *Proc, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if p != nil && !p.Alive() {
			return fmt.Errorf("%s: %s exited (see %s): %v", what, p.Name, p.Log, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killShims stops containerd shims left by the containerd serving sock:
// their command line carries its address.
func killShims(sock string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == sock {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// UnmountUnder unmounts everything mounted below dir, deepest first.
func UnmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			mounts = append(mounts, f[1])
		}
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mounts[i], 0); err != nil {
			if err := syscall.Unmount(mounts[i], syscall.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mounts[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
