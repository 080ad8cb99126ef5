package credplugins

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
	"github.com/cri-image-proxy/cri-image-proxy/internal/execplugin"
)

// DefaultExecTimeout is the kubelet's catch-all timeout for a plugin.
const DefaultExecTimeout = execplugin.DefaultTimeout

// Errors of an exec, for callers that branch and for metric results: the
// bounds of the exec are internal/execplugin's, shared with image policy
// plugins.
var (
	ErrPluginTimeout     = execplugin.ErrTimeout
	ErrPluginFailed      = execplugin.ErrFailed
	ErrPluginOutputLimit = execplugin.ErrOutputLimit
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

	stdout, stderr, err := execplugin.Run(ctx, execplugin.Command{
		Name: e.name, Path: e.path, Args: e.args, Env: e.env, Environ: e.environ, Stdin: data, Timeout: e.timeout,
	})
	if err != nil {
		return nil, stderr, err
	}
	resp, err := pluginapi.DecodeResponse(e.apiVersion, stdout)
	if err != nil {
		return nil, stderr, fmt.Errorf("plugin %s: %w", e.name, err)
	}
	return resp, stderr, nil
}
