package ensure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// Explain tells what the core decides for image (a name or an image ID)
// and, when podUID is set, that pod, without the daemon's grants (it does
// not know them: GrantsKnown is false). It changes nothing.
func (d *Decider) Explain(ctx context.Context, image, podUID string) (*Explanation, error) {
	return d.explain(ctx, image, podUID, nil)
}

// Explain is the Decider's, with the pod's in-memory grant.
func (g *Guard) Explain(ctx context.Context, image, podUID string) (*Explanation, error) {
	e, err := g.Decider.explain(ctx, image, podUID, g.grants.has)
	if err == nil && e.ImageRef != "" {
		e.Verifications = g.verifications.of(e.ImageRef)
	}
	return e, err
}

// explain is Explain; granted, when the caller knows the grants, tells
// whether a pod holds one for an image.
func (d *Decider) explain(ctx context.Context, image, podUID string, granted func(podUID, imageRef string) bool) (*Explanation, error) {
	e := &Explanation{Image: image, Policy: string(d.Policy().Name()), PodUID: podUID, GrantsKnown: granted != nil}
	img, present, err := d.runtime.Image(ctx, crireq.ImageQuery{Name: image})
	if err != nil {
		return nil, fmt.Errorf("asking the runtime about %s: %w", image, err)
	}
	if present {
		e.Present, e.ImageRef = true, img.ID
		if repo, ok := d.repository(image); ok && d.listedAs(repo, img.Names) {
			e.Repository = repo
		}
	} else if imageref.IsID(image) {
		e.ImageRef = image
	} else {
		e.Repository, _ = imageref.Repository(image)
	}
	if e.ImageRef != "" {
		e.Preloaded = d.store.Preloaded(e.ImageRef)
		if rec, err := d.store.Get(e.ImageRef); err == nil {
			e.Record = rec
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if l, ok := d.store.Layers(e.ImageRef); ok {
			seen := l.Seen
			e.LayersSeen = &seen
			for _, diff := range l.DiffIDs {
				e.Layers = append(e.Layers, diff.String())
			}
			if e.Record != nil {
				for repo := range e.Record.CredentialMapping {
					if d.vouchedForAll(repo, e.ImageRef, l) {
						e.Vouched = append(e.Vouched, repo)
					}
				}
				slices.Sort(e.Vouched)
			}
		}
	}
	if !e.Present {
		e.Verdict = "not present: a pod pulls it, and the registry checks its credentials"
		e.Result, e.Rule = resultMustAuth, "not present"
		return e, nil
	}
	dec := d.decide(e.ImageRef, e.Repository, d.askedName(crireq.ImageQuery{Name: image}, e.Repository), img.Names)
	e.NeedsVerification, e.Result, e.Rule = dec.verify, dec.result, dec.rule
	if podUID != "" && granted != nil {
		e.PodGranted = granted(podUID, e.ImageRef)
	}
	var b strings.Builder
	switch {
	case !dec.verify:
		b.WriteString("any pod may use it: ")
	case e.PodGranted:
		b.WriteString("this pod may use it (it pulled it with a verified credential); other pods must verify: ")
	default:
		b.WriteString("hidden from ImageStatus; a pod must pull it with a credential the registry accepts (or one already verified for it): ")
	}
	b.WriteString(dec.rule)
	e.Verdict = b.String()
	return e, nil
}

// vouchedForAll reports whether repo vouched for every layer of imageRef
// in its pull.
func (d *Decider) vouchedForAll(repo, imageRef string, l ImageLayers) bool {
	for _, diff := range l.DiffIDs {
		if ok, err := d.store.Vouched(repo, diff, imageRef); err != nil || !ok {
			return false
		}
	}
	return true
}
