package imagepolicy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/internal/execplugin"
)

// runner runs one plugin once; a seam for tests.
type runner interface {
	run(ctx context.Context, req policyapi.ImagePolicyRequest) (*policyapi.ImagePolicyResponse, []byte, error)
}

// execRunner runs a plugin executable with the bounds of every exec
// plugin of the proxy (internal/execplugin): the request on stdin in the
// provider's apiVersion, the verdict on stdout.
type execRunner struct {
	name, path, apiVersion string
	args, env              []string
	environ                func() []string
	timeout                time.Duration
}

func newExecRunner(p Provider, binDir string) *execRunner {
	e := &execRunner{name: p.Name, path: filepath.Join(binDir, p.Name), apiVersion: p.APIVersion, args: p.Args, environ: os.Environ, timeout: p.Timeout}
	for _, v := range p.Env {
		e.env = append(e.env, v.Name+"="+v.Value)
	}
	return e
}

// run returns the decoded verdict and the plugin's stderr (for the log).
func (e *execRunner) run(ctx context.Context, req policyapi.ImagePolicyRequest) (*policyapi.ImagePolicyResponse, []byte, error) {
	data, err := policyapi.EncodeRequest(e.apiVersion, req)
	if err != nil {
		return nil, nil, fmt.Errorf("plugin %s: encode request: %w", e.name, err)
	}
	stdout, stderr, err := execplugin.Run(ctx, execplugin.Command{
		Name: e.name, Path: e.path, Args: e.args, Env: e.env, Environ: e.environ, Stdin: data, Timeout: e.timeout,
	})
	if err != nil {
		return nil, stderr, err
	}
	resp, err := policyapi.DecodeResponse(e.apiVersion, stdout)
	if err != nil {
		return nil, stderr, fmt.Errorf("plugin %s: %w", e.name, err)
	}
	return resp, stderr, nil
}
