package credplugins

import "github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"

// ErrInvalidResponse marks a plugin answer that is not a valid
// CredentialProviderResponse; its message never quotes the answer.
var ErrInvalidResponse = pluginapi.ErrInvalidResponse
