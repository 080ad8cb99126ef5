package credplugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
)

// Defaults of the exec.
const (
	// DefaultExecTimeout is the kubelet's catch-all timeout for a plugin.
	DefaultExecTimeout = time.Minute
	// maxStdout bounds what a plugin may answer: a response holds a few
	// credentials, far below this.
	maxStdout = 1 << 20
	// maxStderr bounds the diagnostics kept; stderr is only logged.
	maxStderr = 64 << 10
	// waitDelay bounds how long we wait for the pipes after the plugin
	// exited or was killed, when a child it left behind holds them.
	waitDelay = 5 * time.Second
)

// Errors of an exec, for callers that branch and for metric results.
var (
	ErrPluginTimeout     = errors.New("credential provider plugin timed out")
	ErrPluginFailed      = errors.New("credential provider plugin failed")
	ErrPluginOutputLimit = errors.New("credential provider plugin wrote too much")
)

// execRequest is what a plugin is asked.
type execRequest struct {
	Image                     string
	ServiceAccountToken       string
	ServiceAccountAnnotations map[string]string
}

// runner runs one plugin; a seam for tests, as the kubelet's Plugin is.
type runner interface {
	run(ctx context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error)
}

// execPlugin runs a plugin executable as the kubelet does: the request on
// stdin in the provider's apiVersion, args and env from the config (the
// config's env overrides the host's), the response on stdout.
type execPlugin struct {
	name       string
	path       string
	apiVersion string
	args       []string
	env        []string
	environ    func() []string
	timeout    time.Duration
}

func newExecPlugin(p Provider, binDir string, timeout time.Duration) *execPlugin {
	e := &execPlugin{
		name: p.Name, path: filepath.Join(binDir, p.Name), apiVersion: p.APIVersion,
		args: p.Args, environ: os.Environ, timeout: timeout,
	}
	for _, v := range p.Env {
		e.env = append(e.env, v.Name+"="+v.Value)
	}
	if e.timeout <= 0 {
		e.timeout = DefaultExecTimeout
	}
	return e
}

// run executes the plugin once. It returns the decoded response and the
// plugin's stderr (for logs). The plugin and everything it started are
// killed when the timeout passes or it writes more than it may.
func (e *execPlugin) run(ctx context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
	data, err := pluginapi.EncodeRequest(e.apiVersion, &credentialproviderapi.CredentialProviderRequest{
		Image: req.Image, ServiceAccountToken: req.ServiceAccountToken, ServiceAccountAnnotations: req.ServiceAccountAnnotations,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("plugin %s: encode request: %w", e.name, err)
	}

	ctx, cancel := context.WithTimeoutCause(ctx, e.timeout, ErrPluginTimeout)
	defer cancel()
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)

	stdout := &cappedBuffer{max: maxStdout, onOverflow: func() { abort(ErrPluginOutputLimit) }}
	stderr := &cappedBuffer{max: maxStderr}
	cmd := exec.CommandContext(ctx, e.path, e.args...)
	cmd.Stdin = bytes.NewReader(data)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Appended last, the config's variables win (kubernetes/kubernetes#102750).
	cmd.Env = append(e.environ(), e.env...)
	// Its own process group, so that a timeout kills what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay

	runErr := cmd.Run()
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		switch {
		case errors.Is(cause, ErrPluginOutputLimit):
			return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w: more than %d bytes on stdout; killed", e.name, ErrPluginOutputLimit, maxStdout)
		case errors.Is(cause, ErrPluginTimeout):
			return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w after %v; killed with its process group", e.name, ErrPluginTimeout, e.timeout)
		default:
			return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w", e.name, cause)
		}
	}
	if runErr != nil {
		var exitErr *exec.ExitError
		if errors.As(runErr, &exitErr) {
			if exitErr.ExitCode() >= 0 {
				return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w: exit code %d", e.name, ErrPluginFailed, exitErr.ExitCode())
			}
			return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w: %v", e.name, ErrPluginFailed, exitErr.ProcessState)
		}
		return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w: %v", e.name, ErrPluginFailed, runErr)
	}
	resp, err := pluginapi.DecodeResponse(e.apiVersion, stdout.Bytes())
	if err != nil {
		return nil, stderr.Bytes(), fmt.Errorf("plugin %s: %w", e.name, err)
	}
	return resp, stderr.Bytes(), nil
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
