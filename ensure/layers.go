package ensure

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// Layers are where the runtime shares content between images: containerd
// reuses a layer's snapshot whenever the chain ID computed from an image
// config's diff_ids exists, without fetching or checking a blob. So a
// registry that names, in a config of its own, the diff_ids of another
// tenant's private image has the runtime build its image from that
// tenant's layers. The registry is trusted for its own repositories (a
// layer it supplied, or vouched for in a verified pull before); for a
// layer the node holds from elsewhere only its bytes prove anything.
//
// A layer is private on the node when an image holding it has a record
// that restricts some repository (pulled with a secret or a service
// account, or with no verified credential) or a pull of such an image is
// in flight, and no public image holds it: public is an image the proxy
// saw on the node, with no record, before the first private one holding
// the layer (preloaded), an image with preloaded names (on the node, free,
// before its first recorded pull: it still is, by those names and by ID),
// or an image pulled node-wide (anonymously, or with node credentials)
// whose repository vouched for the layer. A record made node-wide before
// this check existed makes nothing public. An image that came around the
// proxy holding a private layer gets no preloaded names from a later pull
// of it: it was never free.
//
// A pull of an image as repo proves by its bytes each private layer that
// repo has not vouched for (Verify; again after the runtime's pull, in
// case the node changed meanwhile), and its record keeps repo's word for
// every layer. An image with no record whose layers include a private one
// it did not hold before that layer became private came around the proxy
// (arrivedAroundTheProxy): it is tracked as pulled with no verified
// credential, so every pod must pull it through the proxy.

// layerFlights are the pulls in flight whose layers the registry check
// has read: until their record is written, their layers count as private
// to every other pull (their credential's outcome is not known yet).
type layerFlights struct {
	mu sync.Mutex
	m  map[*layerFlight]struct{}
}

// layerFlight is one pull's entry: its layers are unknown until its
// registry check read the image's config (known, ready closed).
type layerFlight struct {
	imageID   string
	layers    []digest.Digest
	anonymous bool // the pull goes without a credential: node-wide whatever comes of it
	known     bool
	ready     chan struct{}
}

func newLayerFlights() *layerFlights { return &layerFlights{m: map[*layerFlight]struct{}{}} }

// start enters a pull, before the runtime is asked (so before it can
// unpack anything); end takes it out (after its record is written, or it
// failed).
func (f *layerFlights) start() *layerFlight {
	fl := &layerFlight{ready: make(chan struct{})}
	f.mu.Lock()
	f.m[fl] = struct{}{}
	f.mu.Unlock()
	return fl
}

func (f *layerFlights) end(fl *layerFlight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, fl)
	fl.markKnown()
}

// markKnown ends the wait for fl's layers; f.mu is held.
func (fl *layerFlight) markKnown() {
	if !fl.known {
		fl.known = true
		close(fl.ready)
	}
}

// set says which image and layers fl pulls.
func (f *layerFlights) set(fl *layerFlight, imageID string, layers []digest.Digest, anonymous bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl.imageID, fl.layers, fl.anonymous = imageID, layers, anonymous
	fl.markKnown()
}

// waitKnown waits until every other pull in flight knows its layers (or
// ended): the runtime may have unpacked a layer for one of them that this
// pull's image was then built from. It returns false when ctx ended
// first: those pulls' layers are then unknown.
func (f *layerFlights) waitKnown(ctx context.Context, self *layerFlight) bool {
	f.mu.Lock()
	var pending []chan struct{}
	for fl := range f.m {
		if fl != self && !fl.known {
			pending = append(pending, fl.ready)
		}
	}
	f.mu.Unlock()
	for _, ready := range pending {
		select {
		case <-ready:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// holding reports whether a pull in flight other than self, with a
// credential, pulls an image holding d.
func (f *layerFlights) holding(d digest.Digest, self *layerFlight) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fl := range f.m {
		if fl != self && !fl.anonymous && slices.Contains(fl.layers, d) {
			return true
		}
	}
	return false
}

// flightWait bounds a pull's wait for the layers of the pulls in flight
// beside it.
const flightWait = 2 * time.Minute

// layerPrivacy is why a layer is, or is not, private.
type layerPrivacy struct {
	private bool
	why     string
}

// layerPrivate says whether the layer d is private on the node for an
// image imageID used as repo: held by another tenant's image (imageID's
// own mapping for repo aside), or by a pull in flight other than self,
// first seen before asOf (the zero time: whenever), and by no public
// image. Any read error makes it private.
func (g *Guard) layerPrivate(d digest.Digest, imageID, repo string, self *layerFlight, asOf time.Time, unknownFlights bool) layerPrivacy {
	var private []time.Time // when each private holder was first seen
	type candidate struct {
		ref  string
		seen time.Time
	}
	var preloaded []candidate
	for _, h := range g.store.LayerHolders(d) {
		l, _ := g.store.Layers(h)
		rec, err := g.store.Get(h)
		switch {
		case errors.Is(err, ErrNotFound) && g.unrecorded.has(h):
			private = append(private, l.Seen)
		case errors.Is(err, ErrNotFound):
			// No record: preloaded, if it was here before the private ones,
			// which only a look at the node's images can tell.
			if g.observed.Load() {
				preloaded = append(preloaded, candidate{h, l.Seen})
			}
		case err != nil:
			return layerPrivacy{true, "the record of an image holding it cannot be read"}
		case len(g.store.Preloaded(h)) > 0:
			// On the node, free to every pod, before its first recorded
			// pull (and it did not come around the proxy with a private
			// layer, or it would have no preloaded names): it still is,
			// by those names and by ID, so its layers are public.
			return layerPrivacy{false, "public: held by " + h + ", preloaded"}
		default:
			for r, c := range rec.CredentialMapping {
				if c.NodePodsAccessible {
					// Pulled node-wide: public if that repository vouched
					// for the layer in this image's pull.
					if ok, err := g.store.Vouched(r, d, h); err == nil && ok {
						return layerPrivacy{false, "public: pulled node-wide from " + r}
					}
					continue
				}
				if h == imageID && r == repo {
					continue // this image's own mapping: the registry's word for it
				}
				private = append(private, l.Seen)
				break
			}
		}
	}
	if g.flights.holding(d, self) || unknownFlights {
		// A pull in flight holds it, or may: its outcome, and its
		// credential's, are not known yet.
		private = append(private, g.clock.Now())
	}
	if at, ok := g.unknownLayers.earliestBut(imageID); ok {
		// An image tracked on the node whose layers the runtime did not
		// say may hold it: private until its layers are learnt.
		private = append(private, at)
	}
	if len(private) == 0 {
		return layerPrivacy{false, "no private image holds it"}
	}
	first := slices.MinFunc(private, func(a, b time.Time) int { return a.Compare(b) })
	for _, p := range preloaded {
		// Seen in the same pass as the first private one (the first at
		// the daemon's start): the node held both before anything said
		// which came first, so the preloaded one stands.
		if !p.seen.After(first) {
			return layerPrivacy{false, "public: on the node with " + p.ref + " before any private image"}
		}
	}
	if !asOf.IsZero() && !first.Before(asOf) {
		return layerPrivacy{false, "it became private after the image was first seen"}
	}
	return layerPrivacy{true, "a private image of the node holds it"}
}

// layersToProve names the layers of an image pulled as repo that repo
// must prove by their bytes: those private on the node that repo has not
// vouched for.
func (g *Guard) layersToProve(imageID, repo string, diffIDs []digest.Digest, self *layerFlight, unknownFlights bool) ([]digest.Digest, []string) {
	var want []digest.Digest
	var why []string
	for _, d := range slices.Compact(slices.Sorted(slices.Values(diffIDs))) {
		if ok, err := g.store.Vouched(repo, d, ""); err == nil && ok {
			continue
		}
		if p := g.layerPrivate(d, imageID, repo, self, time.Time{}, unknownFlights); p.private {
			want = append(want, d)
			why = append(why, d.String()+": "+p.why)
		}
	}
	return want, why
}

// layerChooser is the registry check's question for one try of a pull of
// image (repository repo): which layers of the image it resolved must be
// proven by their bytes. The check asks it once the runtime pulled (or
// for the image already on the node), so it sees what the node held when
// the runtime built the image: it enters the pull's layers in flight, and
// waits for the other pulls in flight to know theirs (bounded by the
// proof timeout: past it, their layers count as private).
func (g *Guard) layerChooser(image, repo string, fl *layerFlight, anonymous bool) registry.LayerChooser {
	return func(ctx context.Context, imageID digest.Digest, layers []registry.Layer) ([]digest.Digest, error) {
		diffIDs := diffIDsOf(layers)
		if fl != nil {
			g.flights.set(fl, imageID.String(), diffIDs, anonymous)
		}
		wctx, cancel := context.WithTimeout(ctx, flightWait)
		known := g.flights.waitKnown(wctx, fl)
		cancel()
		g.awaitObserved(ctx) // what was there before decides which layers are public
		if g.kept.any() {
			// A pull cut short (or a crash) may have left an image since:
			// the runtime says what it holds now, and what it left is
			// tracked with its layers before they are decided on.
			if images, err := g.runtime.Images(ctx); err != nil {
				known = false
			} else {
				g.settleKept(ctx, images)
			}
		}
		want, why := g.layersToProve(imageID.String(), repo, diffIDs, fl, !known)
		if len(want) > 0 {
			g.logDecision(ctx, "PullImage: layers the node shares from elsewhere must be proven by their bytes", image, imageID.String(), "", fmt.Sprint(why))
		}
		return want, nil
	}
}

func diffIDsOf(layers []registry.Layer) []digest.Digest {
	out := make([]digest.Digest, len(layers))
	for i, l := range layers {
		out[i] = l.DiffID
	}
	return out
}

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
func (g *Guard) arrivedAroundTheProxy(ctx context.Context, img crireq.Image) (bool, string) {
	if img.ID == "" || !g.Policy().VerificationRequired("", true) {
		return false, ""
	}
	if _, err := g.store.Get(img.ID); !errors.Is(err, ErrNotFound) || g.unrecorded.has(img.ID) {
		return false, "" // a record (or no answer: the decision fails closed) decides it
	}
	came, why := g.cameWithPrivateLayers(ctx, img.ID, nil)
	if !came {
		return false, ""
	}
	if !g.observed.Load() {
		// Not known to have come around the proxy, only not known to have
		// been here before: refused for now, tracked by nothing.
		return true, why
	}
	g.track(ctx, img, "an image that came around the proxy holds another image's private layers: tracked as pulled with no verified credential; every pod must pull it", why)
	return true, why
}

// cameWithPrivateLayers reports whether the image imageID holds a layer
// that was private on the node before the proxy first saw the image (or
// its layers cannot be seen while the node holds private ones): such an
// image may be another tenant's content under a name of its own, and was
// never free to every pod. The pull in flight self (nil: none) is not
// counted as a holder.
//
// Before the proxy has observed the node (a look at its images that
// succeeded), what came when cannot be told: an image holding a private
// layer counts as come with it, and nothing learnt is kept.
func (g *Guard) cameWithPrivateLayers(ctx context.Context, imageID string, self *layerFlight) (bool, string) {
	observed := g.observed.Load()
	l, ok, _ := g.learnLayers(ctx, imageID, g.clock.Now(), observed)
	if !ok {
		if !g.anyPrivateLayer(ctx) {
			return false, ""
		}
		return true, "the runtime does not say which layers it holds, and the node holds private layers"
	}
	asOf := l.Seen
	if !observed {
		asOf = time.Time{}
	}
	for _, d := range l.DiffIDs {
		if p := g.layerPrivate(d, imageID, "", self, asOf, false); p.private {
			if !observed {
				return true, "it holds " + d.String() + ", which is private on the node, and the node's images have not been observed yet"
			}
			return true, "it holds " + d.String() + ", which was private on the node before the image was first seen"
		}
	}
	return false, ""
}

// learnLayers returns what is known of an image's layers, asking the
// runtime when nothing is; with keep, its answer is kept, first seen at
// seen. kept says the layers are in the database (known for good), not
// only learnt for this decision.
func (g *Guard) learnLayers(ctx context.Context, imageID string, seen time.Time, keep bool) (l ImageLayers, ok, kept bool) {
	if l, ok := g.store.Layers(imageID); ok {
		return l, true, true
	}
	diffIDs, ok, err := g.runtime.ImageLayers(ctx, imageID)
	if err != nil || !ok {
		return ImageLayers{}, false, false
	}
	if !keep {
		// Known for this decision only: an image marked as holding unknown
		// layers stays so until they are kept.
		return ImageLayers{DiffIDs: diffIDs, Seen: seen}, true, false
	}
	if err := g.store.NoteLayers(imageID, diffIDs, seen); err != nil {
		// Not kept: known for this decision, learnt again next time.
		g.log.Warn("keeping an image's layers failed", "imageRef", imageID, "err", err)
	}
	if l, ok := g.store.Layers(imageID); ok {
		g.unknownLayers.drop(imageID) // known now, for good
		return l, true, true
	}
	return ImageLayers{DiffIDs: diffIDs, Seen: seen}, true, false
}

// anyPrivateLayer reports whether some image with a restricting record
// has known layers: then an image whose layers cannot be seen may hold
// one.
func (g *Guard) anyPrivateLayer(ctx context.Context) bool {
	images, err := g.runtime.Images(ctx)
	if err != nil {
		return true
	}
	for _, img := range images {
		rec, err := g.store.Get(img.ID)
		if err != nil {
			continue
		}
		for _, c := range rec.CredentialMapping {
			if !c.NodePodsAccessible {
				return true
			}
		}
	}
	return false
}

// track records img as pulled with no verified credential under each
// repository it is listed as: every pod verifies it from now on, and
// ImageStatus hides it.
func (g *Guard) track(ctx context.Context, img crireq.Image, msg, why string) {
	unlock := g.refs.lock(img.ID)
	defer unlock()
	// Its layers, as every end keeps them: learnt, or marked unknown.
	defer g.keepLayers(ctx, img.ID, true)
	repos := map[string]bool{}
	for _, n := range img.Names {
		if r, ok := g.repository(n); ok {
			repos[r] = true
		}
	}
	for r := range repos {
		// No preloaded names: it came around the proxy with a private
		// layer, so it was never free.
		if err := g.store.RecordPull(img.ID, r, Credential{}, "", g.clock.Now(), nil); err != nil {
			g.unrecorded.inc(img.ID)
			g.log.Error("tracking an image failed; every pod verifies it until a restart", "imageRef", img.ID, "err", err)
			break
		}
	}
	if len(repos) == 0 {
		g.unrecorded.inc(img.ID)
	}
	g.metrics.arrivals.Inc()
	g.log.Warn(msg, "imageRef", img.ID, "names", img.Names, "why", why)
}

// ObserveLayers is the first look at the node's images, at the daemon's
// start: it learns the layers of those the proxy does not know yet, so
// that the images the node held before are known as such (preloaded)
// before any pull makes one of their layers private. Until a look (this
// one, or a GC run's) has succeeded, the node is not observed: no image
// counts as preloaded and no layer as public.
func (g *Guard) ObserveLayers(ctx context.Context) error {
	g.looking.Add(1)
	defer g.looking.Add(-1)
	listedAt := g.clock.Now()
	images, err := g.runtime.Images(ctx)
	if err != nil {
		return fmt.Errorf("learning the node's layers: list images: %w", err)
	}
	g.settleKept(ctx, images)
	if !g.observeLayers(ctx, images, listedAt, len(images)) {
		return fmt.Errorf("learning the node's layers: %w", context.Cause(ctx))
	}
	return nil
}

// Observed reports whether a look at the node's images has succeeded.
func (g *Guard) Observed() bool { return g.observed.Load() }

// Looking says a look at the node's images is about to run (the daemon's
// first, before it serves): pulls wait for it, as for one under way, until
// end is called.
func (g *Guard) Looking() (end func()) {
	g.looking.Add(1)
	var once sync.Once
	return func() { once.Do(func() { g.looking.Add(-1) }) }
}

// observeWait bounds a pull's wait for a look at the node's images that is
// under way (the daemon's first, over every image of the node).
const observeWait = time.Minute

// awaitObserved reports whether the node is observed, waiting (bounded by
// observeWait and ctx) for a look under way: a pull that comes while the
// daemon's first look runs (a restart on a node of many images, the
// kubelet pulling at once) decides what was there before with it, rather
// than without (no preloaded name, no public layer).
func (g *Guard) awaitObserved(ctx context.Context) bool {
	if g.observed.Load() {
		return true
	}
	if g.looking.Load() == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, observeWait)
	defer cancel()
	select {
	case <-g.observedNow:
		return true
	case <-ctx.Done():
		return g.observed.Load()
	}
}

// observeLayers learns the layers of the node's images the proxy does not
// know yet, all first seen at the same moment, the look's (the order the
// runtime lists them in says nothing of when they came), and tracks those
// that came around the proxy with private layers; it drops what it knew
// of images gone from the node. At most limit images are asked per look;
// the first look that asks them all, uninterrupted, makes the node
// observed. It reports whether the look was whole.
func (g *Guard) observeLayers(ctx context.Context, images []crireq.Image, listedAt time.Time, limit int) bool {
	if !g.observed.Load() {
		limit = len(images)
	}
	present := make(map[string]bool, len(images))
	asked := 0
	whole := true
	seen := g.clock.Now()
	for _, img := range images {
		present[img.ID] = true
		if _, ok := g.store.Layers(img.ID); ok {
			continue
		}
		if asked >= limit || ctx.Err() != nil {
			whole = false
			continue
		}
		asked++
		if _, _, kept := g.learnLayers(ctx, img.ID, seen, true); !kept && g.restricts(img.ID) {
			g.unknownLayers.add(img.ID, seen)
		}
	}
	// Marks set since the list was taken are of images it may not show.
	g.unknownLayers.retain(func(ref string) bool { return present[ref] }, listedAt)
	if whole && ctx.Err() == nil && g.observed.CompareAndSwap(false, true) {
		close(g.observedNow)
		g.log.Info("the node's images are observed: those found now count as there before the proxy", "images", len(images))
	}
	for _, img := range images {
		if ctx.Err() != nil {
			return false
		}
		if _, ok := g.store.Layers(img.ID); ok {
			g.arrivedAroundTheProxy(ctx, img)
		}
	}
	if _, err := g.store.ForgetLayers(func(ref string) bool { return present[ref] }); err != nil {
		g.log.Warn("forgetting the layers of images gone failed", "err", err)
	}
	return whole && ctx.Err() == nil
}

// restricts reports whether the image imageRef is tracked as not free to
// every pod: a record with a repository that is not node-wide (or one
// that cannot be read), or a pull of it that could not record.
func (g *Guard) restricts(imageRef string) bool {
	if g.unrecorded.has(imageRef) {
		return true
	}
	rec, err := g.store.Get(imageRef)
	switch {
	case errors.Is(err, ErrNotFound):
		return false
	case err != nil:
		return true
	}
	for _, c := range rec.CredentialMapping {
		if !c.NodePodsAccessible {
			return true
		}
	}
	return false
}
