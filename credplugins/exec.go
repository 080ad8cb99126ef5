package credplugins

import (
	"time"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
)

// DefaultExecTimeout is the kubelet's catch-all timeout for a plugin.
const DefaultExecTimeout = execplugin.DefaultTimeout

// Errors of an exec, for callers that branch and for metric results: the
// bounds of the exec are execplugin's, shared with image policy
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
type runner = execplugin.Runner[execRequest, *credentialproviderapi.CredentialProviderResponse]

// codec is the kubelet's plugin API (package pluginapi): a request in the
// provider's apiVersion, the response decoded strictly in the same one.
var codec = execplugin.Codec[execRequest, *credentialproviderapi.CredentialProviderResponse]{
	Encode: func(apiVersion string, req execRequest) ([]byte, error) {
		return pluginapi.EncodeRequest(apiVersion, &credentialproviderapi.CredentialProviderRequest{
			Image: req.Image, ServiceAccountToken: req.ServiceAccountToken, ServiceAccountAnnotations: req.ServiceAccountAnnotations,
		})
	},
	Decode: pluginapi.DecodeResponse,
}

// newExecPlugin runs a plugin executable as the kubelet does: the request
// on stdin in the provider's apiVersion, args and env from the config (the
// config's env overrides the host's), the response on stdout.
func newExecPlugin(p Provider, binDir string, timeout time.Duration) *execplugin.Exec[execRequest, *credentialproviderapi.CredentialProviderResponse] {
	return execplugin.NewExec(p.entry(), binDir, timeout, codec)
}
