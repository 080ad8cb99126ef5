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

// heads proves, with one round of requests in parallel (bounded), that
// the repository holds each manifest and blob for this credential: a HEAD
// of each, and for config (when not nil) a GET whose bytes must be the
// config's. It returns the config's bytes.
func (k *check) heads(ctx context.Context, manifests []digest.Digest, config *ocispec.Descriptor, blobs []ocispec.Descriptor) ([]byte, error) {
	type target struct {
		method string
		path   string
		digest digest.Digest
		accept string
	}
	var targets []target
	if config != nil {
		targets = append(targets, target{http.MethodGet, "/blobs/" + config.Digest.String(), config.Digest, ""})
	}
	for _, d := range manifests {
		targets = append(targets, target{http.MethodHead, "/manifests/" + d.String(), d, acceptManifests})
	}
	for _, b := range blobs {
		targets = append(targets, target{http.MethodHead, "/blobs/" + b.Digest.String(), b.Digest, ""})
	}
	if len(targets) > maxBlobs {
		return nil, failure(ErrUnreachable, "invalid answer", "the image needs %d blobs, over the bound of %d", len(targets), maxBlobs)
	}
	const (
		failed = iota // the zero value: an outcome never set fails closed
		present
		missing
		refused
		forged // a GET whose bytes are not the content asked for
	)
	type outcome struct {
		kind int
		err  error
	}
	outcomes := make([]outcome, len(targets))
	var configBody []byte
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g errgroup.Group
	g.SetLimit(k.c.maxParallel)
	for i, t := range targets {
		g.Go(func() error {
			what := t.method + " " + k.name.repository + t.path
			resp, err := k.do(ctx, t.method, t.path, t.accept)
			switch {
			case errors.Is(err, ErrDenied):
				outcomes[i] = outcome{refused, err}
				return nil
			case err != nil:
				outcomes[i] = outcome{failed, err}
				cancel() // the answer is unreachable anyway: stop asking
				return nil
			}
			if t.method == http.MethodGet && resp.StatusCode == http.StatusOK {
				body, err := readConfig(resp, what, t.digest)
				switch {
				case errors.Is(err, ErrForged):
					outcomes[i] = outcome{forged, err}
				case err != nil:
					outcomes[i] = outcome{failed, err}
					cancel()
				default:
					configBody = body
					outcomes[i] = outcome{kind: present}
				}
				return nil
			}
			discard(resp)
			switch code := resp.StatusCode; {
			case code == http.StatusOK:
				if h := resp.Header.Get("Docker-Content-Digest"); h != "" && h != t.digest.String() {
					outcomes[i] = outcome{failed, failure(ErrUnreachable, "invalid answer", "%s: Docker-Content-Digest names %.80s", what, h)}
					cancel()
					return nil
				}
				outcomes[i] = outcome{kind: present}
			case isRedirect(code) && t.method == http.MethodHead:
				outcomes[i] = outcome{kind: present} // sent on to the storage: see checkRedirect
			case code == http.StatusNotFound:
				outcomes[i] = outcome{kind: missing}
			case code == http.StatusForbidden:
				outcomes[i] = outcome{kind: refused}
			default:
				outcomes[i] = outcome{failed, statusFailure(what, resp)}
				cancel()
			}
			return nil
		})
	}
	g.Wait()

	var absent, forgedDetail []string
	var firstFailure, cancelled error
	regLabel, epLabel := k.c.labels.registry(k.name.registry), k.c.labels.endpoint(k.ep)
	for i, o := range outcomes {
		switch o.kind {
		case present:
			k.res.BlobsChecked++
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobPresent).Inc()
		case forged:
			k.c.metrics.blobs.WithLabelValues(regLabel, epLabel, blobForged).Inc()
			var e *Error
			if errors.As(o.err, &e) {
				forgedDetail = append(forgedDetail, e.Detail)
			}
		case missing, refused:
			how := map[int]string{missing: blobMissing, refused: blobRefused}[o.kind]
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
	if len(forgedDetail) > 0 {
		// The config's bytes are not the config: whatever else the round
		// found, the registry named an image it cannot serve. The pod reads
		// that much; the operator's detail names the registry, the
		// repository and both digests, and what else was not readable.
		detail := fmt.Sprintf("registry %s, repository %s: %s", k.name.registry, k.name.repository, strings.Join(forgedDetail, "; "))
		if len(absent) > 0 {
			detail += "; not readable either: " + strings.Join(absent, ", ")
		}
		return nil, forgery(reasonForgedConfig, "%s", detail)
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
