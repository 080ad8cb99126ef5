package registry

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Credential is what a check authenticates with; the zero value is
// anonymous. As in containerd's CRI (ParseAuth), a username wins over an
// identity token; a registry token, which containerd ignores, is sent as
// a bearer token as is (no token request).
type Credential struct {
	Username, Password string
	IdentityToken      string
	RegistryToken      string
}

// AuthFields is a pull's auth as the CRI carries it: a
// *runtimeapi.AuthConfig has these getters (nil-safe), and this package
// takes it without importing the CRI.
type AuthFields interface {
	GetUsername() string
	GetPassword() string
	GetAuth() string
	GetIdentityToken() string
	GetRegistryToken() string
}

// CredentialOf is a pull's auth as the check takes it: the auth field,
// when it is all there is, decoded to its user and password as the
// runtime decodes it.
func CredentialOf(a AuthFields) Credential {
	c := Credential{Username: a.GetUsername(), Password: a.GetPassword(), IdentityToken: a.GetIdentityToken(), RegistryToken: a.GetRegistryToken()}
	if c.Username == "" && c.Password == "" && a.GetAuth() != "" {
		if dec, err := base64.StdEncoding.DecodeString(a.GetAuth()); err == nil {
			c.Username, c.Password, _ = strings.Cut(string(dec), ":")
		}
	}
	return c
}

// Credential kinds, as Result.CredentialKind names them.
const (
	KindAnonymous     = "anonymous"
	KindBasic         = "basic"
	KindIdentityToken = "identity token"
	KindRegistryToken = "registry token"
)

// Kind names the form of the credential a check will use.
func (c Credential) Kind() string {
	switch {
	case c.Username != "":
		return KindBasic
	case c.IdentityToken != "":
		return KindIdentityToken
	case c.RegistryToken != "":
		return KindRegistryToken
	}
	return KindAnonymous
}

// hostCredentials is the credential in the form containerd's authorizer
// takes it; nil for anonymous (and for a registry token, sent as is).
func (c Credential) hostCredentials() func(string) (string, string, error) {
	var user, secret string
	switch c.Kind() {
	case KindBasic:
		user, secret = c.Username, c.Password
	case KindIdentityToken:
		secret = c.IdentityToken
	default:
		return nil
	}
	return func(string) (string, string, error) { return user, secret, nil }
}

// Request is one question to a registry.
type Request struct {
	// Image as the pod named it: "host/repo:tag", "host/repo@sha256:…",
	// "host/repo:tag@sha256:…", or a short Docker Hub name ("nginx").
	// With a digest, the digest is asked (as containerd does).
	Image string
	// ImageID is the runtime's image ID (the config digest) the answer must
	// match; "" only resolves.
	ImageID string
	// Platform picks the manifest of an index; nil is this node's
	// (containerd's platforms.DefaultSpec).
	Platform *ocispec.Platform
	// Credential the check authenticates with.
	Credential Credential
	// Blobs: also prove that each blob the image needs (its config and
	// layers, and the platform manifest when the reference names an index
	// and that manifest was not fetched from the registry in this check)
	// exists in this repository for this credential; the config by its
	// bytes (GET, its digest verified), the rest by HEAD.
	Blobs bool
	// ProveLayers (with Blobs) names the layers whose bytes the repository
	// must also serve for this credential, decompressing to their
	// diff_ids: content a node shares by digest that this repository has
	// not supplied before. nil proves none.
	ProveLayers LayerChooser
	// Beside, when set (with Blobs), is the runtime's own pull of the
	// image, which the check runs beside: the check asks the registry's
	// word on the reference by HEAD while the runtime pulls, and where the
	// runtime's manifest is the one the registry names, takes the
	// runtime's fetch of it for its bytes (containerd verifies what it
	// fetches): no manifest GET, which some registries count as a pull,
	// beyond the runtime's own. ImageID is then the runtime's.
	Beside RuntimePull
}

// RuntimePull is the runtime's own pull of an image, as a check run beside
// it (Request.Beside) meets it, in this order.
type RuntimePull interface {
	// Resolved is told the manifest digest the registry names for the
	// reference, before the check waits for the runtime: a decision on it
	// (image policy) runs beside the pull. Its error ends the check with
	// it.
	Resolved(ctx context.Context, manifest digest.Digest) error
	// Manifest reads a manifest's bytes from the runtime's own store once
	// its pull has fetched them (it waits until then, or until ctx ends):
	// the check then learns the config's digest while the runtime still
	// pulls the layers, and asks the registry for the config's bytes
	// beside them rather than after the pull. The bytes are verified
	// against the digest the registry named; what the runtime finally
	// holds must still be that config. An error (a runtime whose store
	// cannot be read): the config is asked once the runtime's pull ended.
	Manifest(ctx context.Context, d digest.Digest) ([]byte, error)
	// Pulled waits for the runtime's pull and returns what it proved. Its
	// error ends the check with it.
	Pulled(ctx context.Context) (PulledImage, error)
}

// PulledImage is what the runtime's own pull proved of an image: its ID
// (the config's digest) and the manifest digests it recorded for the
// repository (its repo digests there), whose bytes it fetched and verified.
type PulledImage struct {
	ImageID         digest.Digest
	ManifestDigests []digest.Digest
}

// Result is what the registry answered, and how it was asked. On an
// error, it holds what was learnt before it (the endpoint, the requests).
type Result struct {
	Registry   string // the registry the image names: "docker.io", "registry.example:5000"
	Endpoint   string // the endpoint asked: "https://registry-1.docker.io/v2"
	Vouched    bool   // the endpoint is a mirror the operator vouched for, not the registry's server
	Repository string // the repository at the registry: "library/nginx"

	ManifestDigest digest.Digest // what the reference resolves to (an index or a manifest)
	ImageManifest  digest.Digest // the platform's manifest (== ManifestDigest for a single manifest)
	ConfigDigest   digest.Digest // the image's config: the runtime's image ID

	Blobs        []digest.Digest // the blobs the image needs: its config, then its layers
	BlobsChecked int             // blobs (and manifests) proven present in the repository: the config by its bytes, the rest by HEAD

	// Layers are the image's layers, from the config the check fetched
	// (with Blobs): each blob with the diff_id the config gives it.
	Layers []Layer
	// Proven are the diff_ids whose bytes the repository served and that
	// were verified (ProveLayers); ProvenBytes what fetching them cost.
	Proven      []digest.Digest
	ProvenBytes int64

	Requests       int    // HTTP requests this check made, token requests and redirects included
	ManifestGets   int    // of which GETs of a manifest: what Docker Hub counts as a pull
	CredentialKind string // KindAnonymous, KindBasic, KindIdentityToken or KindRegistryToken
}

// imageName is a Request.Image, parsed.
type imageName struct {
	registry   string        // "docker.io"
	repository string        // "library/nginx"
	object     string        // the tag or the digest asked for
	digest     digest.Digest // the reference's digest, if any
}

// String is the repository and the object asked for: "team-a/app:v1",
// "team-a/app@sha256:…".
func (n imageName) String() string {
	if n.digest != "" {
		return n.repository + "@" + n.object
	}
	return n.repository + ":" + n.object
}

var errInvalidRequest = errors.New("invalid registry check request")

func parseImage(s string) (imageName, error) {
	if imageref.IsID(s) {
		return imageName{}, fmt.Errorf("%w: %q is an image ID, not a reference", errInvalidRequest, s)
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return imageName{}, fmt.Errorf("%w: image %q: %v", errInvalidRequest, s, err)
	}
	n := imageName{registry: reference.Domain(named), repository: reference.Path(named), object: "latest"}
	if t, ok := named.(reference.Tagged); ok {
		n.object = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		n.digest = d.Digest()
		n.object = n.digest.String()
	}
	return n, nil
}

// parseImageID accepts "sha256:<hex>" and, as the CRI does, bare hex.
func parseImageID(s string) (digest.Digest, error) {
	if s == "" {
		return "", nil
	}
	if !strings.Contains(s, ":") {
		s = "sha256:" + s
	}
	d, err := digest.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%w: image ID %q: %v", errInvalidRequest, s, err)
	}
	return d, nil
}
