package execplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Defaults of a run.
const (
	// DefaultTimeout is the kubelet's catch-all timeout for a plugin.
	DefaultTimeout = time.Minute
	// DefaultMaxStdout bounds what a plugin may answer: an answer holds a
	// few credentials or a verdict, far below this.
	DefaultMaxStdout = 1 << 20
	// DefaultMaxStderr bounds the diagnostics kept; stderr is only logged.
	DefaultMaxStderr = 64 << 10
	// waitDelay bounds how long we wait for the pipes after the plugin
	// exited or was killed, when a child it left behind holds them.
	waitDelay = 5 * time.Second
)

// Errors of a run, for callers that branch and for metric results.
var (
	ErrTimeout     = errors.New("plugin timed out")
	ErrFailed      = errors.New("plugin failed")
	ErrOutputLimit = errors.New("plugin wrote too much")
)

// Command is one run of a plugin.
type Command struct {
	// Name names the plugin in errors.
	Name string
	// Path is the executable.
	Path string
	Args []string
	// Env holds NAME=value pairs from the configuration, appended after the
	// host's environment: they win.
	Env []string
	// Environ returns the host's environment; nil means os.Environ.
	Environ func() []string
	// Stdin is the request.
	Stdin []byte
	// Timeout bounds the run; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxStdout and MaxStderr bound the output kept; 0 means the defaults.
	MaxStdout, MaxStderr int
}

// Run executes c once and returns its stdout and stderr (stderr also on
// error, for the log). The plugin and everything it started are killed
// when the timeout passes, ctx is done, or it writes more than MaxStdout.
func Run(ctx context.Context, c Command) (stdout, stderr []byte, err error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	maxStdout, maxStderr := c.MaxStdout, c.MaxStderr
	if maxStdout <= 0 {
		maxStdout = DefaultMaxStdout
	}
	if maxStderr <= 0 {
		maxStderr = DefaultMaxStderr
	}
	environ := c.Environ
	if environ == nil {
		environ = os.Environ
	}

	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer cancel()
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)

	out := &cappedBuffer{max: maxStdout, onOverflow: func() { abort(ErrOutputLimit) }}
	errOut := &cappedBuffer{max: maxStderr}
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Stdin = bytes.NewReader(c.Stdin)
	cmd.Stdout, cmd.Stderr = out, errOut
	cmd.Env = append(environ(), c.Env...)
	// Its own process group, so that a timeout kills what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay

	runErr := cmd.Run()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		switch {
		case errors.Is(cause, ErrOutputLimit):
			return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w: more than %d bytes on stdout; killed", c.Name, ErrOutputLimit, maxStdout)
		case errors.Is(cause, ErrTimeout):
			return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w after %v; killed with its process group", c.Name, ErrTimeout, timeout)
		default:
			return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w", c.Name, cause)
		}
	}
	if runErr != nil {
		var exitErr *exec.ExitError
		if errors.As(runErr, &exitErr) {
			if exitErr.ExitCode() >= 0 {
				return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w: exit code %d", c.Name, ErrFailed, exitErr.ExitCode())
			}
			return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w: %v", c.Name, ErrFailed, exitErr.ProcessState)
		}
		return nil, errOut.Bytes(), fmt.Errorf("plugin %s: %w: %v", c.Name, ErrFailed, runErr)
	}
	return out.Bytes(), errOut.Bytes(), nil
}

// cappedBuffer keeps at most max bytes; past that it calls onOverflow
// once and discards the rest. It must not embed bytes.Buffer: io.Copy would
// use the buffer's ReadFrom and bypass the cap.
type cappedBuffer struct {
	buf        bytes.Buffer
	max        int
	onOverflow func()
	overflowed bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room < len(p) {
		if room > 0 {
			c.buf.Write(p[:room])
		}
		if !c.overflowed && c.onOverflow != nil {
			c.overflowed = true
			c.onOverflow()
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// Bytes returns what was kept.
func (c *cappedBuffer) Bytes() []byte { return c.buf.Bytes() }

// MaxLoggedStderr caps what a log line quotes of a plugin's stderr.
const MaxLoggedStderr = 1024

// secretShaped matches what may be a secret a plugin printed that the
// proxy does not know: a JWT (a service account token), a Basic or Bearer
// authorization value, and key=value or "key": "value" pairs whose key
// names a secret.
var secretShaped = regexp.MustCompile(`eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]*)?` +
	`|(?i)\b(basic|bearer)\s+[A-Za-z0-9._~+/=-]+` +
	`|(?i)"?(password|passwd|secret|token|auth|authorization|identitytoken|registrytoken)"?\s*[:=]\s*"?((basic|bearer)\s+)?[^\s",}]+`)

// ForLog returns stderr as a log line may quote it: the known secrets and
// anything secret-shaped masked, trimmed, at most MaxLoggedStderr bytes.
func ForLog(stderr []byte, known ...string) string {
	s := string(stderr)
	for _, k := range known {
		if k != "" {
			s = strings.ReplaceAll(s, k, "[redacted]")
		}
	}
	s = strings.TrimSpace(secretShaped.ReplaceAllString(s, "[redacted]"))
	if len(s) <= MaxLoggedStderr {
		return s
	}
	return s[:MaxLoggedStderr] + "…(truncated)"
}
