package crireq

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// RegistryCredential is a CRI auth as the registry check takes it: the
// auth field, when it is all there is, decoded to its user and password as
// the runtime decodes it.
func RegistryCredential(a *runtimeapi.AuthConfig) registry.Credential {
	c := registry.Credential{Username: a.GetUsername(), Password: a.GetPassword(), IdentityToken: a.GetIdentityToken(), RegistryToken: a.GetRegistryToken()}
	if c.Username == "" && c.Password == "" && a.GetAuth() != "" {
		if dec, err := base64.StdEncoding.DecodeString(a.GetAuth()); err == nil {
			c.Username, c.Password, _ = strings.Cut(string(dec), ":")
		}
	}
	return c
}

// RegistryRefusal is a registry check that failed, as the client sees it:
// the image as the pod named it and the registry's short reason, nothing
// of another tenant's (no digest: the operator's log has them); a refusal
// is PermissionDenied, a forged answer (bytes that are not the content
// their digest names) too, a registry that cannot be asked Unavailable,
// an answer that is not the image Aborted (retry).
func RegistryRefusal(image string, err error) error {
	var rerr *registry.Error
	reason := "the registry check could not be made"
	if errors.As(err, &rerr) && rerr.Reason != "" {
		reason = rerr.Reason
	}
	var code error
	switch {
	case errors.Is(err, registry.ErrForged):
		// A refusal of this pull, whatever else the error says: a retry
		// fetches the same bytes.
		code = errdefs.ErrPermissionDenied
	case errors.Is(err, registry.ErrDenied):
		code = errdefs.ErrPermissionDenied
	case errors.Is(err, registry.ErrMoved):
		code = errdefs.ErrAborted
	case errors.Is(err, registry.ErrUnreachable):
		code = errdefs.ErrUnavailable
	default:
		code = errdefs.ErrInvalidArgument
	}
	return fmt.Errorf("pulling %s: %s: %w", image, reason, code)
}
