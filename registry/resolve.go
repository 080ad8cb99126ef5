package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// resolve answers what the reference names, and whether the registry was
// asked for it in this check (asked is false for a digest reference found
// in the cache, served before at this endpoint and repository). A tag
// whose digest is remembered, with that manifest in the cache, served
// here, is asked with a HEAD: a GET of a manifest counts as a pull
// against some registries' rate limits (Docker Hub), a HEAD does not, and
// the runtime's own re-check is a HEAD. Any other answer to that HEAD (the
// tag moved, no digest named) and any other reference is a GET, verified
// against the digest asked for and the one the registry names: a registry
// has to serve a manifest's bytes at least once before a HEAD naming its
// digest counts.
func (k *check) resolve(ctx context.Context) (m *manifest, d digest.Digest, asked bool, err error) {
	p := "/manifests/" + k.name.object
	if k.name.digest != "" {
		if m, servedHere := k.c.manifests.get(k.name.digest, k.place()); servedHere {
			return m, k.name.digest, false, nil
		}
	} else if d, ok := k.c.tags.get(k.tagKey()); ok {
		if m, servedHere := k.c.manifests.get(d, k.place()); servedHere {
			resp, err := k.do(ctx, http.MethodHead, p, acceptManifests)
			if err != nil {
				return nil, "", false, err
			}
			if resp.StatusCode != http.StatusOK && !isRedirect(resp.StatusCode) {
				return nil, "", false, statusFailure("HEAD "+k.name.repository+p, resp)
			}
			discard(resp)
			if resp.StatusCode == http.StatusOK && resp.Header.Get("Docker-Content-Digest") == d.String() {
				return m, d, true, nil
			}
		}
	}
	resp, err := k.do(ctx, http.MethodGet, p, acceptManifests)
	if err != nil {
		return nil, "", false, err
	}
	body, err := readManifest(resp, "GET "+k.name.repository+p)
	if err != nil {
		return nil, "", false, err
	}
	if k.name.digest != "" {
		if err := verifyDigest(body, k.name.digest); err != nil {
			return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: the answer is not the content asked for: %v", k.name.repository, p, err)
		}
		d = k.name.digest
	}
	if h := resp.Header.Get("Docker-Content-Digest"); h != "" {
		hd, err := digest.Parse(h)
		if err == nil {
			err = verifyDigest(body, hd)
		}
		if err != nil {
			return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: Docker-Content-Digest does not name the body: %v", k.name.repository, p, err)
		}
		if d == "" {
			d = hd
		}
	}
	if d == "" {
		d = digest.FromBytes(body)
	}
	m, err = parseManifest(body, contentType(resp.Header.Get("Content-Type")))
	if err != nil {
		return nil, "", false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	k.c.manifests.put(d, m, int64(len(body)), k.place())
	if k.name.digest == "" {
		k.c.tags.put(k.tagKey(), d)
	}
	return m, d, true, nil
}

// tagKey names the reference's tag at this endpoint, for the tag memory.
func (k *check) tagKey() string { return k.ep.String() + " " + k.name.String() }

// place names the endpoint and repository a check asks, for the manifest
// cache's memory of where a manifest's bytes were served.
func (k *check) place() string { return k.ep.String() + " " + k.name.repository }

// manifestByDigest is an index's entry: from the cache where this
// repository served it before (fetched is false: a HEAD must still prove
// it), else GET by digest here, so that an index of another registry's
// naming a manifest it cannot serve gains nothing.
func (k *check) manifestByDigest(ctx context.Context, desc ocispec.Descriptor) (m *manifest, fetched bool, err error) {
	if m, servedHere := k.c.manifests.get(desc.Digest, k.place()); servedHere {
		return m, false, nil
	}
	p := "/manifests/" + desc.Digest.String()
	resp, err := k.do(ctx, http.MethodGet, p, acceptManifests)
	if err != nil {
		return nil, false, err
	}
	body, err := readManifest(resp, "GET "+k.name.repository+p)
	if err != nil {
		return nil, false, err
	}
	if err := verifyDigest(body, desc.Digest); err != nil {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	if int64(len(body)) != desc.Size {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %d bytes, the index says %d", k.name.repository, p, len(body), desc.Size)
	}
	m, err = parseManifest(body, desc.MediaType)
	if err == nil && (isIndexType(desc.MediaType) || desc.MediaType == ocispec.MediaTypeImageManifest || desc.MediaType == mediaTypeDockerManifest) && m.index != isIndexType(desc.MediaType) {
		err = fmt.Errorf("the index names media type %s for another kind of content", desc.MediaType)
	}
	if err != nil {
		return nil, false, failure(ErrUnreachable, "invalid answer", "GET %s%s: %v", k.name.repository, p, err)
	}
	k.c.manifests.put(desc.Digest, m, int64(len(body)), k.place())
	return m, true, nil
}

// readManifest reads a manifest answer, bounded; any status but 200 is a
// failure.
func readManifest(resp *http.Response, what string) ([]byte, error) {
	if resp.StatusCode != http.StatusOK {
		return nil, statusFailure(what, resp)
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxManifestBytes {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a %d byte manifest, over the %d byte bound", what, resp.ContentLength, maxManifestBytes)
	}
	body, err := io.ReadAll(resp.Body)
	if errors.Is(err, errBodyTooLarge) {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a manifest over the %d byte bound", what, maxManifestBytes)
	}
	if err != nil {
		return nil, transportFailure(what, err)
	}
	return body, nil
}
