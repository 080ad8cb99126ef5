package execplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Runner runs a provider's plugin once: the decoded answer to req, and
// the plugin's stderr (also on error, for the log). *Exec is the real one;
// tests give fakes, as the kubelet's tests do.
type Runner[Req, Resp any] interface {
	Run(ctx context.Context, req Req) (Resp, []byte, error)
}

// Codec is a kind's plugin API on the wire, in each of its versions.
type Codec[Req, Resp any] struct {
	// Encode encodes a request in apiVersion.
	Encode func(apiVersion string, req Req) ([]byte, error)
	// Decode decodes a plugin's stdout strictly and refuses an answer in
	// any version but apiVersion, the request's. Its error never quotes
	// the answer, which may hold credentials.
	Decode func(apiVersion string, stdout []byte) (Resp, error)
}

// Exec runs a plugin executable with the bounds of Run: the request on
// stdin in the provider's apiVersion, the answer on stdout, decoded in the
// same apiVersion: an answer in another version is refused.
type Exec[Req, Resp any] struct {
	// Command is the run: its Stdin is set for each request.
	Command
	// APIVersion is the provider's plugin API version.
	APIVersion string
	Codec      Codec[Req, Resp]
}

// NewExec returns the runner of e's executable in binDir, bounded by
// timeout (0: DefaultTimeout), its args and env from e, over the host's
// environment.
func NewExec[Req, Resp any](e Entry, binDir string, timeout time.Duration, codec Codec[Req, Resp]) *Exec[Req, Resp] {
	x := &Exec[Req, Resp]{
		Command:    Command{Name: e.Name, Path: filepath.Join(binDir, e.Name), Args: e.Args, Environ: os.Environ, Timeout: timeout},
		APIVersion: e.APIVersion,
		Codec:      codec,
	}
	for _, v := range e.Env {
		x.Env = append(x.Env, v.Name+"="+v.Value)
	}
	return x
}

// Run executes the plugin once for req. The plugin and everything it
// started are killed when the timeout passes, ctx is done, or it writes
// more than it may.
func (x *Exec[Req, Resp]) Run(ctx context.Context, req Req) (Resp, []byte, error) {
	var zero Resp
	data, err := x.Codec.Encode(x.APIVersion, req)
	if err != nil {
		return zero, nil, fmt.Errorf("plugin %s: encode request: %w", x.Name, err)
	}
	c := x.Command
	c.Stdin = data
	stdout, stderr, err := Run(ctx, c)
	if err != nil {
		return zero, stderr, err
	}
	resp, err := x.Codec.Decode(x.APIVersion, stdout)
	if err != nil {
		return zero, stderr, fmt.Errorf("plugin %s: %w", x.Name, err)
	}
	return resp, stderr, nil
}
