package ensure

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/periodic"
)

// Recover settles the intents a crash left behind (those found when the
// guard was made), as the kubelet does at start: an intent whose image the
// runtime lists becomes a record with no credential for its repository
// (every pod must verify). An intent it cannot match is kept, on disk and
// in memory, and its repository keeps counting as a pull in flight (its
// images are never taken for preloaded ones) until it is settled: by a
// later GC run that finds its image, or by a pull of the same image through
// the proxy. Only an intent whose name is no reference is dropped: it
// names nothing to protect. Call it before serving, and again if it fails.
func (g *Guard) Recover(ctx context.Context) (converted, kept int, err error) {
	g.kept.mu.Lock()
	defer g.kept.mu.Unlock()
	if len(g.kept.list) == 0 {
		return 0, 0, nil
	}
	images, err := g.runtime.Images(ctx)
	if err != nil {
		return 0, len(g.kept.list), fmt.Errorf("settling %d pull intents: list images: %w", len(g.kept.list), err)
	}
	return g.ledger.settleLocked(ctx, images)
}

// GC drops the records of images the runtime no longer lists and the
// grants of pods it no longer runs, both older than the grace period. When
// the runtime cannot be asked, nothing is dropped.
func (g *Guard) GC(ctx context.Context) (records, grants int, err error) {
	until := g.clock.Now().Add(-g.grace)
	listedAt := g.clock.Now()
	images, err := g.runtime.Images(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("gc: list images: %w", err)
	}
	g.ledger.settleKept(ctx, images)
	if records, err = g.prune(images, until); err != nil {
		return 0, 0, err
	}
	g.ledger.observeLayers(ctx, images, listedAt, observeLimit)
	alive, err := g.runtime.PodUIDs(ctx)
	if err != nil {
		return records, 0, fmt.Errorf("gc: list pod sandboxes: %w", err)
	}
	grants = g.grants.gc(func(uid string) bool { return alive[uid] }, until)
	g.removals.gc(until)
	// A run decodes the runtime's whole image and sandbox lists (a few MiB
	// on a busy node), garbage the moment it ends. With the daemon's GOGC
	// of 300 the heap would keep that room for minutes: measured +8 MiB
	// RSS after a run with 1,000 images. Give it back now; this costs one
	// collection of a small heap every gcInterval.
	debug.FreeOSMemory()
	return records, grants, nil
}

// observeLimit bounds the images a GC run asks the runtime the layers of
// (a verbose ImageStatus each); the rest wait for the next run.
const observeLimit = 256

// Run collects garbage every interval until ctx is done.
func (g *Guard) Run(ctx context.Context, interval time.Duration) {
	periodic.Every(ctx, interval, func(ctx context.Context) {
		if r, gr, err := g.GC(ctx); err != nil {
			g.log.Warn("ensure garbage collection failed; nothing was dropped", "err", err)
		} else if r+gr > 0 {
			g.log.Info("ensure garbage collection", "records", r, "grants", gr)
		}
	})
}

// Remove has the runtime remove an image (remove) and then drops its
// record and grants, unless the runtime still has it under some name.
func (g *Guard) Remove(ctx context.Context, q crireq.ImageQuery, remove func(context.Context) error) error {
	img, _, _ := g.resolve(ctx, q)
	ref := img.ID
	if err := remove(ctx); err != nil || ref == "" {
		return err
	}
	// containerd removes the image with every name it has; if some name
	// is left (another runtime), the record must stay. A pull of the image
	// finishing meanwhile records after the forget (refLocks).
	unlock := g.refs.lock(ref)
	defer unlock()
	if _, present, err := g.runtime.Image(ctx, crireq.ImageQuery{Name: ref}); err == nil && !present {
		g.removals.note(ref, g.clock.Now())
		if _, err := g.store.Forget(ref); err != nil {
			g.log.Error("dropping the record of a removed image failed; GC will", "imageRef", ref, "err", err)
		}
		g.grants.dropImage(ref)
	}
	return nil
}

// ObserveLayers is the first look at the node's images, at the daemon's
// start: it learns the layers of those the proxy does not know yet, so
// that the images the node held before are known as such (preloaded)
// before any pull makes one of their layers private. Until a look (this
// one, or a GC run's) has succeeded, the node is not observed: no image
// counts as preloaded and no layer as public.
func (g *Guard) ObserveLayers(ctx context.Context) error {
	end := g.layers.Observation.Looking()
	defer end()
	listedAt := g.clock.Now()
	images, err := g.runtime.Images(ctx)
	if err != nil {
		return fmt.Errorf("learning the node's layers: list images: %w", err)
	}
	g.ledger.settleKept(ctx, images)
	if !g.ledger.observeLayers(ctx, images, listedAt, len(images)) {
		return fmt.Errorf("learning the node's layers: %w", context.Cause(ctx))
	}
	return nil
}

// Observed reports whether a look at the node's images has succeeded.
func (g *Guard) Observed() bool { return g.layers.Observation.Observed() }

// Looking says a look at the node's images is about to run (the daemon's
// first, before it serves): pulls wait for it, as for one under way, until
// end is called.
func (g *Guard) Looking() (end func()) { return g.layers.Observation.Looking() }
