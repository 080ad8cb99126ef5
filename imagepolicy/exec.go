package imagepolicy

import (
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// runner runs one plugin once; a seam for tests.
type runner = execplugin.Runner[policyapi.ImagePolicyRequest, *policyapi.ImagePolicyResponse]

// codec is the image policy plugin API (package policyapi): the request in
// the provider's apiVersion, the verdict decoded strictly in the same one.
var codec = execplugin.Codec[policyapi.ImagePolicyRequest, *policyapi.ImagePolicyResponse]{
	Encode: policyapi.EncodeRequest,
	Decode: policyapi.DecodeResponse,
}

// newExecRunner runs a plugin executable with the bounds of every exec
// plugin of the proxy (execplugin) and the provider's timeout.
func newExecRunner(p Provider, binDir string) runner {
	return execplugin.NewExec(p.entry(), binDir, p.Timeout, codec)
}
