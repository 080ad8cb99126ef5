package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// An image's config, proven by its bytes, and a forgery of them refused:
// its whole path is in this file. A registry proves it holds a config
// only by serving it (a runtime that holds the config fetches nothing, so
// a HEAD 200 would let a registry that never held it name another image
// already on the node). The config is asked by GET (getConfig) in the
// check's round of blob requests (blobRound, blobs.go), or in a round of
// its own beside the runtime's pull (fetchConfig: early, configEarly, or
// once the runtime pulled); its bytes are read and compared with its
// digest (readConfig); other bytes are a forged outcome, and the round
// that has one is refused (configForgery): ErrForged, a kind of
// ErrDenied, whose Refusal (errors.go) is PermissionDenied with
// reasonForgedConfig for the pod. The checks and blobs metrics count it
// as "forged" (Check, judgeRound), and a warning is logged (Check).

// maxConfigBytes bounds an image config: real ones are kilobytes; the
// manifest's bound is generous for them.
const maxConfigBytes = maxManifestBytes

// reasonForgedConfig is the pod's reason for a forged config: short, no
// digest (the operator's detail has them).
const reasonForgedConfig = "the registry's bytes are not the image's config"

// getConfig asks for the config t by GET, in a round of blob requests:
// its bytes, read and verified by readConfig, are the proof, and bytes
// that are not the config are a forged outcome. An answer other than a
// 200 is judged by its status (statusOutcome, blobs.go), as a HEAD's is;
// a GET's redirect is followed (checkRedirect), so never taken as present.
func (k *check) getConfig(ctx context.Context, t blobTarget) blobOutcome {
	resp, err := k.do(ctx, http.MethodGet, t.path, t.accept)
	if err != nil {
		return requestFailed(err)
	}
	if resp.StatusCode != http.StatusOK {
		return k.statusOutcome(t, resp)
	}
	body, err := readConfig(resp, http.MethodGet+" "+k.name.repository+t.path, t.digest)
	switch {
	case errors.Is(err, ErrForged):
		return blobOutcome{kind: outcomeForged, err: err}
	case err != nil:
		return blobOutcome{kind: outcomeFailed, err: err}
	}
	return blobOutcome{kind: outcomePresent, body: body}
}

// readConfig reads a GET of an image's config and verifies its bytes: a
// registry proves it holds an image's config only by serving it (a
// runtime that holds the config already fetches nothing, so a HEAD 200
// would let a registry that never had it name another tenant's image).
// Bytes that are not the config are a forgery (ErrForged).
func readConfig(resp *http.Response, what string, d digest.Digest) ([]byte, error) {
	defer resp.Body.Close()
	if resp.ContentLength > maxConfigBytes {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a %d byte config, over the %d byte bound", what, resp.ContentLength, maxConfigBytes)
	}
	body, err := io.ReadAll(resp.Body)
	switch {
	case errors.Is(err, errBodyTooLarge):
		return nil, failure(ErrUnreachable, "invalid answer", "%s: a config over the %d byte bound", what, maxConfigBytes)
	case err != nil:
		return nil, transportFailure(what, err)
	}
	if err := d.Validate(); err != nil {
		return nil, failure(ErrUnreachable, "invalid answer", "%s: config digest %.80q: %v", what, d, err)
	}
	if got := d.Algorithm().FromBytes(body); got != d {
		return nil, forgery(reasonForgedConfig, "%s: %d bytes whose digest is %s, not the config %s", what, len(body), got, d)
	}
	return body, nil
}

// configForgery refuses a round in which the config's bytes were not the
// config (forged: the errors of its forged outcomes): whatever else the
// round found, the registry named an image it cannot serve. The pod reads
// that much (reasonForgedConfig); the operator's detail names the
// registry, the repository and both digests, and what else was not
// readable (absent).
func (k *check) configForgery(forged []error, absent []string) *Error {
	var details []string
	for _, err := range forged {
		var e *Error
		if errors.As(err, &e) {
			details = append(details, e.Detail)
		} else {
			details = append(details, err.Error())
		}
	}
	detail := fmt.Sprintf("registry %s, repository %s: %s", k.name.registry, k.name.repository, strings.Join(details, "; "))
	if len(absent) > 0 {
		detail += "; not readable either: " + strings.Join(absent, ", ")
	}
	return forgery(reasonForgedConfig, "%s", detail)
}

// fetchConfig asks for the config d alone, by GET: a round of blob
// requests of its own, beside the runtime's pull (whose fetch of the
// manifest the check takes for the manifest's bytes).
func (k *check) fetchConfig(ctx context.Context, d digest.Digest) ([]byte, error) {
	return k.blobRound(ctx, nil, &ocispec.Descriptor{Digest: d}, nil)
}

// errNoEarlyConfig: the config was not asked beside the runtime's pull
// (no manifest from the runtime, or another config than it pulled).
var errNoEarlyConfig = errors.New("no config asked beside the pull")

// earlyConfig is the registry's answer for a config asked beside the
// runtime's pull.
type earlyConfig struct {
	done   chan struct{}
	cancel context.CancelFunc
	digest digest.Digest // the config asked; "" when none
	body   []byte
	err    error
}

// configEarly asks the registry for the config of the manifest d (the
// registry's word for the reference) as soon as the runtime's store holds
// that manifest (RuntimePull.Manifest), beside the rest of the runtime's
// pull. When the store cannot be read, it asks nothing.
func (k *check) configEarly(ctx context.Context, spec ocispec.Platform, r Request, d digest.Digest) *earlyConfig {
	e := &earlyConfig{done: make(chan struct{})}
	ctx, e.cancel = context.WithCancel(ctx)
	go func() {
		defer close(e.done)
		config, err := k.configOf(ctx, spec, r.Beside, d)
		if err != nil {
			return // asked once the pull ended, as without it
		}
		cctx, cancel := context.WithTimeout(ctx, k.c.timeout)
		defer cancel()
		e.digest = config
		e.body, e.err = k.fetchConfig(cctx, config)
	}()
	return e
}

// stop ends the early question, if it still runs, and waits for it: once
// the check returns, nothing of it counts into the check's result. Its
// waits (the runtime's store, the registry) all end with its context.
func (e *earlyConfig) stop() {
	if e.cancel != nil {
		e.cancel()
		<-e.done
	}
}

// wait returns the registry's answer for the config imageID when it was
// asked early, and errNoEarlyConfig otherwise.
func (e *earlyConfig) wait(imageID digest.Digest) ([]byte, error) {
	if e.cancel == nil {
		return nil, errNoEarlyConfig
	}
	<-e.done
	e.cancel()
	if e.digest != imageID {
		// Another config than the runtime holds (or none): the runtime's
		// image decides what is asked.
		return nil, errNoEarlyConfig
	}
	return e.body, e.err
}

// configOf is the config digest of the manifest d for the platform, read
// from the runtime's store (an index leads to the platform's manifest),
// each verified against its digest.
func (k *check) configOf(ctx context.Context, spec ocispec.Platform, store RuntimePull, d digest.Digest) (digest.Digest, error) {
	for depth := 0; depth <= maxIndexDepth; depth++ {
		body, err := store.Manifest(ctx, d)
		if err != nil {
			return "", err
		}
		if err := verifyDigest(body, d); err != nil {
			return "", err
		}
		m, err := parseManifest(body, "")
		if err != nil {
			return "", err
		}
		if !m.index {
			return m.config.Digest, nil
		}
		desc, ok := pickManifest(m.manifests, platforms.Only(spec))
		if !ok {
			return "", errors.New("no manifest for this platform")
		}
		d = desc.Digest
	}
	return "", errors.New("indexes nested too deep")
}
