package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
)

// blobTarget is one request of a round of blob requests: the config's
// GET (getConfig, config.go), or a HEAD of a manifest or a blob (headBlob).
type blobTarget struct {
	method string
	path   string
	digest digest.Digest
	accept string
}

// outcomeKind is what the repository's answer to a target says.
type outcomeKind int

const (
	outcomeFailed  outcomeKind = iota // the zero value: an outcome never set fails closed
	outcomePresent                    // held for the credential
	outcomeMissing                    // 404
	outcomeRefused                    // 403, or a denial
	outcomeForged                     // a GET whose bytes are not the content asked for (getConfig)
)

// blobOutcome is a target's outcome.
type blobOutcome struct {
	kind outcomeKind
	err  error
	body []byte // the config's bytes, verified (getConfig)
}

// blobRound proves, with one round of requests in parallel (bounded),
// that the repository holds each manifest and blob for this credential: a
// HEAD of each, and for config (when not nil) a GET whose bytes must be
// the config's (getConfig, config.go). It returns the config's bytes.
func (k *check) blobRound(ctx context.Context, manifests []digest.Digest, config *ocispec.Descriptor, blobs []ocispec.Descriptor) ([]byte, error) {
	var targets []blobTarget
	if config != nil {
		targets = append(targets, blobTarget{http.MethodGet, "/blobs/" + config.Digest.String(), config.Digest, ""})
	}
	for _, d := range manifests {
		targets = append(targets, blobTarget{http.MethodHead, "/manifests/" + d.String(), d, acceptManifests})
	}
	for _, b := range blobs {
		targets = append(targets, blobTarget{http.MethodHead, "/blobs/" + b.Digest.String(), b.Digest, ""})
	}
	if len(targets) > maxBlobs {
		return nil, failure(ErrUnreachable, "invalid answer", "the image needs %d blobs, over the bound of %d", len(targets), maxBlobs)
	}
	return k.judgeRound(targets, k.askRound(ctx, targets))
}

// askRound sends the round's requests, in the targets' order, at most
// maxParallel at a time, and returns each target's outcome. A failure
// stops the requests not yet sent: the round is unreachable anyway.
func (k *check) askRound(ctx context.Context, targets []blobTarget) []blobOutcome {
	outcomes := make([]blobOutcome, len(targets))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(k.c.maxParallel)
	for i, t := range targets {
		g.Go(func() error {
			if t.method == http.MethodGet {
				outcomes[i] = k.getConfig(ctx, t)
			} else {
				outcomes[i] = k.headBlob(ctx, t)
			}
			if outcomes[i].kind == outcomeFailed {
				cancel() // the answer is unreachable anyway: stop asking
			}
			return nil
		})
	}
	g.Wait()
	return outcomes
}

// headBlob asks for a manifest or a blob by HEAD.
func (k *check) headBlob(ctx context.Context, t blobTarget) blobOutcome {
	resp, err := k.do(ctx, http.MethodHead, t.path, t.accept)
	if err != nil {
		return requestFailed(err)
	}
	return k.statusOutcome(t, resp)
}

// requestFailed is the outcome of a request that had no answer to judge:
// refused when the registry or its token endpoint denied it, else failed.
func requestFailed(err error) blobOutcome {
	if errors.Is(err, ErrDenied) {
		return blobOutcome{kind: outcomeRefused, err: err}
	}
	return blobOutcome{kind: outcomeFailed, err: err}
}

// statusOutcome judges an answer by its status, its body discarded:
// present on a 200 (that names no other digest) or, for a HEAD, a
// redirect to the registry's storage; missing on a 404; refused on a 403.
func (k *check) statusOutcome(t blobTarget, resp *http.Response) blobOutcome {
	what := t.method + " " + k.name.repository + t.path
	discard(resp)
	switch code := resp.StatusCode; {
	case code == http.StatusOK:
		if h := resp.Header.Get("Docker-Content-Digest"); h != "" && h != t.digest.String() {
			return blobOutcome{kind: outcomeFailed, err: failure(ErrUnreachable, "invalid answer", "%s: Docker-Content-Digest names %.80s", what, h)}
		}
		return blobOutcome{kind: outcomePresent}
	case isRedirect(code) && t.method == http.MethodHead:
		return blobOutcome{kind: outcomePresent} // sent on to the storage: see checkRedirect
	case code == http.StatusNotFound:
		return blobOutcome{kind: outcomeMissing}
	case code == http.StatusForbidden:
		return blobOutcome{kind: outcomeRefused}
	default:
		return blobOutcome{kind: outcomeFailed, err: statusFailure(what, resp)}
	}
}

// judgeRound counts each outcome in the blobs metric and answers for the
// round: a forged config first (configForgery, config.go), then the blobs
// not readable (ErrDenied), then the first failure; else the config's
// bytes (nil without a config), or the caller's context's error.
func (k *check) judgeRound(targets []blobTarget, outcomes []blobOutcome) ([]byte, error) {
	var absent []string
	var forged []error
	var configBody []byte
	var firstFailure, cancelled error
	regLabel, epLabel := k.c.labels.registry(k.name.registry), k.c.labels.endpoint(k.ep)
	for i, o := range outcomes {
		switch o.kind {
		case outcomePresent:
			k.res.BlobsChecked++
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobPresent).Inc()
			if o.body != nil {
				configBody = o.body
			}
		case outcomeForged:
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobForged).Inc()
			forged = append(forged, o.err)
		case outcomeMissing, outcomeRefused:
			how := map[outcomeKind]string{outcomeMissing: blobMissing, outcomeRefused: blobRefused}[o.kind]
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, how).Inc()
			absent = append(absent, fmt.Sprintf("%s %s", targets[i].digest, how))
		default:
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobError).Inc()
			switch {
			case o.err == nil:
				firstFailure = failure(ErrUnreachable, "internal error", "%s %s%s: no outcome", targets[i].method, k.name.repository, targets[i].path)
			case errors.Is(o.err, context.Canceled):
				cancelled = o.err
			case firstFailure == nil:
				firstFailure = o.err
			}
		}
	}
	nAbsent := len(absent)
	if nAbsent > 10 {
		absent = append(absent[:10], "…")
	}
	if len(forged) > 0 {
		return nil, k.configForgery(forged, absent)
	}
	if nAbsent > 0 {
		return nil, failure(ErrDenied, fmt.Sprintf("%d of %d blobs not readable in the repository", nAbsent, len(targets)),
			"in %s: %s", k.name.repository, strings.Join(absent, ", "))
	}
	if firstFailure != nil {
		return nil, firstFailure
	}
	return configBody, cancelled // nil, or the caller's context was cancelled
}
