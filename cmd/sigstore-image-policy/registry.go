package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// The cosign formats.
const (
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	simpleSigningType      = "cosign container image signature"
	bundleMediaTypePrefix  = "application/vnd.dev.sigstore.bundle"
	cosignSigArtifactType  = "application/vnd.dev.cosign.artifact.sig.v1+json"
	signPredicateType      = "https://sigstore.dev/cosign/sign/v1"
	emptyMediaType         = "application/vnd.oci.empty.v1+json"

	annotationSignature   = "dev.cosignproject.cosign/signature"
	annotationCertificate = "dev.sigstore.cosign/certificate"
	annotationBundle      = "dev.sigstore.cosign/bundle"
	annotationTimestamp   = "dev.sigstore.cosign/rfc3161timestamp"
)

// Bounds of what is read from a registry: an image has a few signatures,
// each a few KiB.
const (
	maxSignatures = 32
	maxBlobSize   = 1 << 20
)

// candidate is one signature found for an image, or why one that was
// found could not be read.
type candidate struct {
	where string // for reasons: "tag sha256-….sig layer 0", "referrer sha256:…"
	// legacy: a simple signing payload and its layer's annotations.
	payload     []byte
	annotations map[string]string
	// bundle: a sigstore bundle's JSON.
	bundle []byte
	err    error
}

// registry reads one repository with the request's credential.
type registry struct {
	repo name.Repository
	opts []remote.Option
}

// newRegistry reaches repository's registry as the policy says, with cred
// (nil: anonymously).
func (p *Policy) newRegistry(ctx context.Context, repository string, cred *policyapi.Credential) (*registry, error) {
	repo, err := name.NewRepository(repository)
	if err != nil {
		return nil, fmt.Errorf("repository %q: %w", repository, err)
	}
	host := repo.RegistryStr()
	var rt http.RoundTripper = remote.DefaultTransport
	if rc, ok := p.registryFor(host); ok {
		base := remote.DefaultTransport.(*http.Transport).Clone()
		if rc.CAFile != "" {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			b, err := os.ReadFile(rc.CAFile)
			if err != nil {
				return nil, err
			}
			pool.AppendCertsFromPEM(b)
			base.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		rt = base
		if rc.Endpoint != "" {
			u, _ := url.Parse(rc.Endpoint) // validated at load
			rt = &endpointTransport{host: host, endpoint: u, base: base}
		}
	}
	auth := authn.Anonymous
	if cred != nil && (cred.Username != "" || cred.Password != "") {
		auth = authn.FromConfig(authn.AuthConfig{Username: cred.Username, Password: cred.Password})
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth), remote.WithTransport(rt)}
	// One puller for every request of the run: the registry is pinged and
	// the credential exchanged once, not per request (each a round trip,
	// and the image's pull waits for this verdict).
	puller, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, err
	}
	return &registry{repo: repo, opts: append(opts, remote.Reuse(puller))}, nil
}

// endpointTransport sends the requests for a registry host to the
// endpoint the policy names for it (a mirror of the name, a plain-HTTP
// port); requests to other hosts (a token service) go as they are.
type endpointTransport struct {
	host     string
	endpoint *url.URL
	base     http.RoundTripper
}

func (t *endpointTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == t.host {
		req = req.Clone(req.Context())
		req.URL.Scheme, req.URL.Host = t.endpoint.Scheme, t.endpoint.Host
	}
	return t.base.RoundTrip(req)
}

// find returns the signatures of digest: the cosign tag's layers, then
// the referrers. An error means the registry could not be asked; a
// signature that cannot be read is a candidate with err.
//
// The two places are asked at the same time: the image's pull waits for
// the verdict, and each is a round trip or more to the registry.
func (r *registry) find(digest string) ([]candidate, error) {
	d := r.repo.Digest(digest)
	var tagged, referred []candidate
	var tagErr, refErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		tag := r.repo.Tag(strings.Replace(digest, ":", "-", 1) + ".sig")
		m, err := r.manifest(tag)
		switch {
		case isNotFound(err):
		case err != nil:
			tagErr = fmt.Errorf("reading %s: %w", tag, err)
		default:
			tagged = r.legacy("tag "+tag.TagStr(), &m.Manifest)
		}
	}()
	go func() {
		defer wg.Done()
		idx, err := remote.Referrers(d, r.opts...)
		switch {
		case isNotFound(err):
			return
		case err != nil:
			refErr = fmt.Errorf("listing the referrers of %s: %w", d, err)
			return
		}
		im, err := idx.IndexManifest()
		if err != nil {
			refErr = fmt.Errorf("listing the referrers of %s: %w", d, err)
			return
		}
		for _, desc := range im.Manifests {
			if len(referred) >= maxSignatures {
				break
			}
			referred = append(referred, r.referrer(desc)...)
		}
	}()
	wg.Wait()
	if err := errors.Join(tagErr, refErr); err != nil {
		return nil, err
	}
	out := append(tagged, referred...)
	if len(out) > maxSignatures {
		out = out[:maxSignatures]
	}
	return out, nil
}

// referrer reads one referrer of the image: a sigstore bundle (cosign
// v3) or a cosign signature manifest (cosign's OCI 1.1 mode); others
// (SBOMs, attestations of other tools) are none. The referrers list names
// its artifactType; where it gives only the empty config's media type (a
// registry that ignores artifactType), the manifest itself is read.
func (r *registry) referrer(desc v1.Descriptor) []candidate {
	where := "referrer " + desc.Digest.String()
	artifactType := desc.ArtifactType
	var m *manifestWithType
	if artifactType == "" || artifactType == emptyMediaType {
		var err error
		if m, err = r.manifest(r.repo.Digest(desc.Digest.String())); err != nil {
			return []candidate{{where: where, err: err}}
		}
		artifactType = m.ArtifactType
		if artifactType == "" && len(m.Layers) > 0 {
			artifactType = string(m.Layers[0].MediaType)
		}
	}
	switch {
	case strings.HasPrefix(artifactType, bundleMediaTypePrefix):
		return []candidate{r.bundle(where, desc.Digest, m)}
	case artifactType == cosignSigArtifactType || artifactType == simpleSigningMediaType:
		if m == nil {
			var err error
			if m, err = r.manifest(r.repo.Digest(desc.Digest.String())); err != nil {
				return []candidate{{where: where, err: err}}
			}
		}
		return r.legacy(where, &m.Manifest)
	}
	return nil
}

// manifestWithType is an image manifest with OCI 1.1's artifactType.
type manifestWithType struct {
	v1.Manifest
	ArtifactType string `json:"artifactType,omitempty"`
}

// manifest fetches and parses an image manifest.
func (r *registry) manifest(ref name.Reference) (*manifestWithType, error) {
	desc, err := remote.Get(ref, r.opts...)
	if err != nil {
		return nil, err
	}
	var m manifestWithType
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", ref, err)
	}
	return &m, nil
}

// legacy reads the simple signing layers of a cosign signature manifest.
func (r *registry) legacy(where string, m *v1.Manifest) []candidate {
	var out []candidate
	for i, l := range m.Layers {
		if len(out) >= maxSignatures {
			break
		}
		if l.MediaType != simpleSigningMediaType {
			continue
		}
		c := candidate{where: fmt.Sprintf("%s layer %d", where, i), annotations: l.Annotations}
		c.payload, c.err = r.blob(l)
		out = append(out, c)
	}
	return out
}

// bundle reads a referrer's sigstore bundle: its manifest's first layer.
// m is the manifest when already read.
func (r *registry) bundle(where string, digest v1.Hash, m *manifestWithType) candidate {
	c := candidate{where: where}
	if m == nil {
		var err error
		if m, err = r.manifest(r.repo.Digest(digest.String())); err != nil {
			c.err = err
			return c
		}
	}
	if len(m.Layers) == 0 || !strings.HasPrefix(string(m.Layers[0].MediaType), bundleMediaTypePrefix) {
		c.err = errors.New("no sigstore bundle layer")
		return c
	}
	c.bundle, c.err = r.blob(m.Layers[0])
	return c
}

// blob fetches a small blob and checks its digest.
func (r *registry) blob(desc v1.Descriptor) ([]byte, error) {
	if desc.Size > maxBlobSize {
		return nil, fmt.Errorf("blob %s is %d bytes, more than %d", desc.Digest, desc.Size, maxBlobSize)
	}
	l, err := remote.Layer(r.repo.Digest(desc.Digest.String()), r.opts...)
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed() // the blob as stored; it checks the digest at EOF
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxBlobSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxBlobSize {
		return nil, fmt.Errorf("blob %s is more than %d bytes", desc.Digest, maxBlobSize)
	}
	return b, nil
}

func isNotFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}

// simpleSigning is the part of cosign's payload that is checked.
type simpleSigning struct {
	Critical struct {
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// checkPayload verifies that a verified simple signing payload is a cosign
// image signature of digest.
func checkPayload(payload []byte, digest string) error {
	var ss simpleSigning
	if err := json.Unmarshal(payload, &ss); err != nil {
		return fmt.Errorf("payload is not simple signing JSON")
	}
	if ss.Critical.Type != simpleSigningType {
		return fmt.Errorf("payload type is %q, not %q", ss.Critical.Type, simpleSigningType)
	}
	if ss.Critical.Image.DockerManifestDigest != digest {
		return fmt.Errorf("it signs %s, not this image", ss.Critical.Image.DockerManifestDigest)
	}
	return nil
}
