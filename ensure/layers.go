package ensure

import (
	"context"
	"errors"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// The layers' decisions are package layerprivacy's (its doc says what a
// private layer is); here is the ledger's use of them: the images that
// came around the proxy (arrivedAroundTheProxy, track), and the looks at
// the node's images (observeLayers; the Guard's ObserveLayers is the
// first, GC's the next). The pull path's question is verify.go's
// layerChooser.

// arrivedAroundTheProxy decides an image a container would see that has
// no record: preloaded, as the records go, unless it holds a layer that
// was private on the node before the proxy first saw the image. containerd
// builds an image from the node's layers by their diff_ids, so such an
// image may be another tenant's content under a name of its own, pulled
// around the proxy (or left by a pull the proxy refused). It is then
// tracked as pulled with no verified credential under each repository it
// is listed as (every pod must pull it through the proxy, which proves
// its layers), and true is returned. A runtime that gives no config for
// the image leaves its layers unseen: it counts as arrived when any
// private layer is on the node.
func (l *ledger) arrivedAroundTheProxy(ctx context.Context, img crireq.Image) (bool, string) {
	if img.ID == "" || !l.Policy().VerificationRequired("", true) {
		return false, ""
	}
	if _, err := l.store.Get(img.ID); !errors.Is(err, ErrNotFound) || l.unrecorded.has(img.ID) {
		return false, "" // a record (or no answer: the decision fails closed) decides it
	}
	came, why := l.layers.CameWithPrivateLayers(ctx, img.ID, nil)
	if !came {
		return false, ""
	}
	if !l.layers.Observation.Observed() {
		// Not known to have come around the proxy, only not known to have
		// been here before: refused for now, tracked by nothing.
		return true, why
	}
	l.track(ctx, img, "an image that came around the proxy holds another image's private layers: tracked as pulled with no verified credential; every pod must pull it", why)
	return true, why
}

// track records img as pulled with no verified credential under each
// repository it is listed as: every pod verifies it from now on, and
// ImageStatus hides it.
func (l *ledger) track(ctx context.Context, img crireq.Image, msg, why string) {
	unlock := l.refs.lock(img.ID)
	defer unlock()
	// Its layers, as every end keeps them: learnt, or marked unknown.
	defer l.keepLayers(ctx, img.ID, true)
	repos := map[string]bool{}
	for _, n := range img.Names {
		if r, ok := l.repository(n); ok {
			repos[r] = true
		}
	}
	for r := range repos {
		// No preloaded names: it came around the proxy with a private
		// layer, so it was never free.
		if err := l.store.RecordPull(img.ID, r, Credential{}, "", l.clock.Now(), nil); err != nil {
			l.unrecorded.inc(img.ID)
			l.log.Error("tracking an image failed; every pod verifies it until a restart", "imageRef", img.ID, "err", err)
			break
		}
	}
	if len(repos) == 0 {
		l.unrecorded.inc(img.ID)
	}
	l.metrics.arrivals.Inc()
	l.log.Warn(msg, "imageRef", img.ID, "names", img.Names, "why", why)
}

// observeLayers learns the layers of the node's images the proxy does not
// know yet, all first seen at the same moment, the look's (the order the
// runtime lists them in says nothing of when they came), and tracks those
// that came around the proxy with private layers; it drops what it knew
// of images gone from the node. At most limit images are asked per look;
// the first look that asks them all, uninterrupted, makes the node
// observed. It reports whether the look was whole.
func (l *ledger) observeLayers(ctx context.Context, images []crireq.Image, listedAt time.Time, limit int) bool {
	if !l.layers.Observation.Observed() {
		limit = len(images)
	}
	present := make(map[string]bool, len(images))
	asked := 0
	whole := true
	seen := l.clock.Now()
	for _, img := range images {
		present[img.ID] = true
		if _, ok := l.store.Layers(img.ID); ok {
			continue
		}
		if asked >= limit || ctx.Err() != nil {
			whole = false
			continue
		}
		asked++
		if _, _, kept := l.layers.Learn(ctx, img.ID, seen, true); !kept && l.layers.Restricts(img.ID) {
			l.layers.Unknown.Add(img.ID, seen)
		}
	}
	// Marks set since the list was taken are of images it may not show.
	l.layers.Unknown.Retain(func(ref string) bool { return present[ref] }, listedAt)
	if whole && ctx.Err() == nil && l.layers.Observation.MarkObserved() {
		l.log.Info("the node's images are observed: those found now count as there before the proxy", "images", len(images))
	}
	for _, img := range images {
		if ctx.Err() != nil {
			return false
		}
		if _, ok := l.store.Layers(img.ID); ok {
			l.arrivedAroundTheProxy(ctx, img)
		}
	}
	if _, err := l.store.ForgetLayers(func(ref string) bool { return present[ref] }); err != nil {
		l.log.Warn("forgetting the layers of images gone failed", "err", err)
	}
	return whole && ctx.Err() == nil
}
