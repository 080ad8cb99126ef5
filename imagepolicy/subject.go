package imagepolicy

import (
	"errors"
	"fmt"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// The wire types a Subject is made of.
type (
	Call       = policyapi.Call
	Pod        = policyapi.Pod
	Platform   = policyapi.Platform
	Credential = policyapi.Credential
)

// The calls a decision is made at.
const (
	CallPullImage       = policyapi.CallPullImage
	CallCreateContainer = policyapi.CallCreateContainer
	CallImageVolume     = policyapi.CallImageVolume
)

// Subject is what a decision is about: an image, where and for whom.
type Subject struct {
	// Call is where the proxy asks.
	Call Call
	// Image is the image as the CRI request names it (a reference, an
	// image ID or a prefix of one): for the plugin and the log.
	Image string
	// Repository is the normalized repository the image is known under
	// ("registry.test/team/app"); it selects the providers by matchImages.
	// Empty when the image is known by ID only: then every provider of the
	// namespace applies. The engine never derives it from Image: a short
	// hex string may be a name or an ID prefix.
	Repository string
	// Digest is the manifest digest: at PullImage, the one resolved at the
	// registry that the pull is pinned to; at create, the runtime's repo
	// digest for Repository, when it has one.
	Digest string
	// ImageID is the image's ID, when known (always at create).
	ImageID string
	// Platform is the platform pulled and run; nil: not said.
	Platform *Platform
	// Pod is the pod; an empty namespace is the configuration's
	// defaultNamespace (crictl, bake jobs).
	Pod Pod
	// Credential is the pull's registry credential, given only to
	// providers with sendCredentials; nil: none (anonymous, or at create).
	Credential *Credential
}

// ErrInvalidSubject marks a subject the engine cannot decide on: a
// programming error of the caller; the verdict that comes with it refuses.
var ErrInvalidSubject = errors.New("image policy: invalid subject")

func (s *Subject) validate() error {
	switch s.Call {
	case CallPullImage, CallCreateContainer, CallImageVolume:
	default:
		return fmt.Errorf("%w: call %q", ErrInvalidSubject, s.Call)
	}
	if s.Image == "" {
		return fmt.Errorf("%w: no image", ErrInvalidSubject)
	}
	return nil
}

// validateIdentity checks that a subject a provider applies to says which
// image it is: a plugin decides on a digest or an image ID. A subject no
// provider applies to is decided by its namespace's no-match policy
// without either (a pull no registry was asked about).
func (s *Subject) validateIdentity() error {
	if s.Digest == "" && s.ImageID == "" {
		return fmt.Errorf("%w: image %s has neither a digest nor an image ID", ErrInvalidSubject, s.Image)
	}
	return nil
}

// cacheKeys are the keys a subject's verdicts are cached under: the image
// ID (what a container runs) and the manifest digest (what a pull names),
// each as the repository names it. The cache key is (digest,
// provider, namespace); the repository is in it too because a plugin may
// decide per repository (the reference plugin's policies do): a verdict
// for one repository's copy of a digest is not the other's.
func (s *Subject) cacheKeys() []string {
	keys := make([]string, 0, 2)
	if s.ImageID != "" {
		keys = append(keys, cacheKey(s.Repository, s.ImageID))
	}
	if s.Digest != "" && s.Digest != s.ImageID {
		keys = append(keys, cacheKey(s.Repository, s.Digest))
	}
	return keys
}

// cacheKey is the cache key of an image ID or digest as repo names it;
// repo is "" for an image known by ID only.
func cacheKey(repo, id string) string { return repo + "@" + id }
