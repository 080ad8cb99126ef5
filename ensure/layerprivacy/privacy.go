package layerprivacy

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/opencontainers/go-digest"
)

// Store is what the decisions read of the records (and the layers they
// keep); *records.Store is the real one.
type Store interface {
	// Get returns the record of an image ID, or an error wrapping
	// records.ErrNotFound.
	Get(imageRef string) (*records.Record, error)
	// Preloaded returns the names imageRef was listed under before its
	// first recorded pull; memory only.
	Preloaded(imageRef string) []string
	// Layers returns what is known of an image's layers; memory only.
	Layers(imageRef string) (records.ImageLayers, bool)
	// LayerHolders returns the images known to hold the layer; memory only.
	LayerHolders(diffID digest.Digest) []string
	// Vouched reports whether repo vouched for the layer in the verified
	// pull of imageRef ("": any image) that still has its record.
	Vouched(repo string, diffID digest.Digest, imageRef string) (bool, error)
	// NoteLayers keeps an image's layers, first seen at seen, unless they
	// are known already.
	NoteLayers(imageRef string, diffIDs []digest.Digest, seen time.Time) error
}

// Runtime is what the decisions ask the container runtime.
type Runtime interface {
	// Images lists the node's images.
	Images(ctx context.Context) ([]crireq.Image, error)
	// ImageLayers returns the diff_ids of the image's layers; ok is false
	// when the runtime does not say.
	ImageLayers(ctx context.Context, imageID string) (diffIDs []digest.Digest, ok bool, err error)
}

// Node decides which layers of the node are private, from the records
// (store), the runtime, the pulls in flight (Flights), the images whose
// layers are not known (Unknown) and whether the node was observed
// (Observation). It is safe for concurrent use.
type Node struct {
	Flights     *Flights
	Unknown     *Unknown
	Observation *Observation

	store   Store
	runtime Runtime
	// unrecorded reports an image pulled through the proxy whose record
	// could not be written: it counts as restricting.
	unrecorded func(imageRef string) bool
	now        func() time.Time
	log        *slog.Logger
}

// New returns the decisions over store and rt, with nothing in flight,
// nothing unknown and the node not observed yet.
func New(store Store, rt Runtime, unrecorded func(imageRef string) bool, now func() time.Time, log *slog.Logger) *Node {
	return &Node{Flights: NewFlights(), Unknown: NewUnknown(), Observation: NewObservation(),
		store: store, runtime: rt, unrecorded: unrecorded, now: now, log: log}
}

// Privacy is whether a layer is private, and why.
type Privacy struct {
	Private bool
	Why     string
}

// Private says whether the layer d is private on the node for an
// image imageID used as repo: held by another tenant's image (imageID's
// own mapping for repo aside), or by a pull in flight other than self,
// first seen before asOf (the zero time: whenever), and by no public
// image. Any read error makes it private.
func (n *Node) Private(d digest.Digest, imageID, repo string, self *Flight, asOf time.Time, unknownFlights bool) Privacy {
	var private []time.Time // when each private holder was first seen
	type candidate struct {
		ref  string
		seen time.Time
	}
	var preloaded []candidate
	for _, h := range n.store.LayerHolders(d) {
		l, _ := n.store.Layers(h)
		rec, err := n.store.Get(h)
		switch {
		case errors.Is(err, records.ErrNotFound) && n.unrecorded(h):
			private = append(private, l.Seen)
		case errors.Is(err, records.ErrNotFound):
			// No record: preloaded, if it was here before the private ones,
			// which only a look at the node's images can tell.
			if n.Observation.Observed() {
				preloaded = append(preloaded, candidate{h, l.Seen})
			}
		case err != nil:
			return Privacy{true, "the record of an image holding it cannot be read"}
		case len(n.store.Preloaded(h)) > 0:
			// On the node, free to every pod, before its first recorded
			// pull (and it did not come around the proxy with a private
			// layer, or it would have no preloaded names): it still is,
			// by those names and by ID, so its layers are public.
			return Privacy{false, "public: held by " + h + ", preloaded"}
		default:
			for r, c := range rec.CredentialMapping {
				if c.NodePodsAccessible {
					// Pulled node-wide: public if that repository vouched
					// for the layer in this image's pull.
					if ok, err := n.store.Vouched(r, d, h); err == nil && ok {
						return Privacy{false, "public: pulled node-wide from " + r}
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
	if n.Flights.Holding(d, self) || unknownFlights {
		// A pull in flight holds it, or may: its outcome, and its
		// credential's, are not known yet.
		private = append(private, n.now())
	}
	if at, ok := n.Unknown.EarliestBut(imageID); ok {
		// An image tracked on the node whose layers the runtime did not
		// say may hold it: private until its layers are learnt.
		private = append(private, at)
	}
	if len(private) == 0 {
		return Privacy{false, "no private image holds it"}
	}
	first := slices.MinFunc(private, func(a, b time.Time) int { return a.Compare(b) })
	for _, p := range preloaded {
		// Seen in the same pass as the first private one (the first at
		// the daemon's start): the node held both before anything said
		// which came first, so the preloaded one stands.
		if !p.seen.After(first) {
			return Privacy{false, "public: on the node with " + p.ref + " before any private image"}
		}
	}
	if !asOf.IsZero() && !first.Before(asOf) {
		return Privacy{false, "it became private after the image was first seen"}
	}
	return Privacy{true, "a private image of the node holds it"}
}

// ToProve names the layers of an image pulled as repo that repo
// must prove by their bytes: those private on the node that repo has not
// vouched for.
func (n *Node) ToProve(imageID, repo string, diffIDs []digest.Digest, self *Flight, unknownFlights bool) ([]digest.Digest, []string) {
	var want []digest.Digest
	var why []string
	for _, d := range slices.Compact(slices.Sorted(slices.Values(diffIDs))) {
		if ok, err := n.store.Vouched(repo, d, ""); err == nil && ok {
			continue
		}
		if p := n.Private(d, imageID, repo, self, time.Time{}, unknownFlights); p.Private {
			want = append(want, d)
			why = append(why, d.String()+": "+p.Why)
		}
	}
	return want, why
}

// CameWithPrivateLayers reports whether the image imageID holds a layer
// that was private on the node before the proxy first saw the image (or
// its layers cannot be seen while the node holds private ones): such an
// image may be another tenant's content under a name of its own, and was
// never free to every pod. The pull in flight self (nil: none) is not
// counted as a holder.
//
// Before the proxy has observed the node (a look at its images that
// succeeded), what came when cannot be told: an image holding a private
// layer counts as come with it, and nothing learnt is kept.
func (n *Node) CameWithPrivateLayers(ctx context.Context, imageID string, self *Flight) (bool, string) {
	observed := n.Observation.Observed()
	l, ok, _ := n.Learn(ctx, imageID, n.now(), observed)
	if !ok {
		if !n.AnyPrivate(ctx) {
			return false, ""
		}
		return true, "the runtime does not say which layers it holds, and the node holds private layers"
	}
	asOf := l.Seen
	if !observed {
		asOf = time.Time{}
	}
	for _, d := range l.DiffIDs {
		if p := n.Private(d, imageID, "", self, asOf, false); p.Private {
			if !observed {
				return true, "it holds " + d.String() + ", which is private on the node, and the node's images have not been observed yet"
			}
			return true, "it holds " + d.String() + ", which was private on the node before the image was first seen"
		}
	}
	return false, ""
}

// Learn returns what is known of an image's layers, asking the
// runtime when nothing is; with keep, its answer is kept, first seen at
// seen. kept says the layers are in the database (known for good), not
// only learnt for this decision.
func (n *Node) Learn(ctx context.Context, imageID string, seen time.Time, keep bool) (l records.ImageLayers, ok, kept bool) {
	if l, ok := n.store.Layers(imageID); ok {
		return l, true, true
	}
	diffIDs, ok, err := n.runtime.ImageLayers(ctx, imageID)
	if err != nil || !ok {
		return records.ImageLayers{}, false, false
	}
	if !keep {
		// Known for this decision only: an image marked as holding unknown
		// layers stays so until they are kept.
		return records.ImageLayers{DiffIDs: diffIDs, Seen: seen}, true, false
	}
	if err := n.store.NoteLayers(imageID, diffIDs, seen); err != nil {
		// Not kept: known for this decision, learnt again next time.
		n.log.Warn("keeping an image's layers failed", "imageRef", imageID, "err", err)
	}
	if l, ok := n.store.Layers(imageID); ok {
		n.Unknown.Drop(imageID) // known now, for good
		return l, true, true
	}
	return records.ImageLayers{DiffIDs: diffIDs, Seen: seen}, true, false
}

// AnyPrivate reports whether some image with a restricting record
// has known layers: then an image whose layers cannot be seen may hold
// one.
func (n *Node) AnyPrivate(ctx context.Context) bool {
	images, err := n.runtime.Images(ctx)
	if err != nil {
		return true
	}
	for _, img := range images {
		rec, err := n.store.Get(img.ID)
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

// Restricts reports whether the image imageRef is tracked as not free to
// every pod: a record with a repository that is not node-wide (or one
// that cannot be read), or a pull of it that could not record.
func (n *Node) Restricts(imageRef string) bool {
	if n.unrecorded(imageRef) {
		return true
	}
	rec, err := n.store.Get(imageRef)
	switch {
	case errors.Is(err, records.ErrNotFound):
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
