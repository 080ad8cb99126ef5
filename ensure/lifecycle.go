package ensure

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/distribution/reference"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
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
	return g.settleLocked(ctx, images)
}

// settleLocked converts the kept intents whose image is in images and
// keeps the others. g.kept.mu is held.
func (g *Guard) settleLocked(ctx context.Context, images []crireq.Image) (converted, kept int, err error) {
	byName := map[string]string{} // normalized reference -> image ID
	for _, img := range images {
		for _, r := range img.Names {
			if n, ok := imageref.Normalized(r); ok {
				byName[n] = img.ID
			}
		}
	}
	var keep []Intent
	for i, in := range g.kept.list {
		ref := listedID(byName, in.Image)
		repo, _ := imageref.Repository(in.Image)
		switch {
		case repo == "":
			err = g.store.DropIntent(in.ID)
		case ref == "":
			keep = append(keep, in)
			continue
		default:
			// No preloaded names: what the image was listed under before
			// the interrupted pull is not known (those names verify).
			err = g.store.RecordPull(ref, repo, Credential{}, in.ID, g.clock.Now(), nil)
			if err == nil {
				g.keepLayers(ctx, ref, true)
				g.log.Info("a pull was interrupted; its image needs verification by every pod", "image", in.Image, "imageRef", ref)
				converted++
			}
		}
		if err != nil {
			g.kept.setLocked(append(keep, g.kept.list[i:]...))
			return converted, len(g.kept.list), err
		}
		if repo != "" {
			g.pending.dec(repo)
		}
	}
	g.kept.setLocked(keep)
	return converted, len(keep), nil
}

// settleKept settles the kept intents whose image images (the runtime's
// list) shows: before any look decides what the node's images are, so
// that an image a cut pull or a crash left is tracked, with its layers,
// never taken for one that was there before.
func (g *Guard) settleKept(ctx context.Context, images []crireq.Image) {
	if !g.kept.any() {
		return
	}
	g.kept.mu.Lock()
	before := g.kept.sinceLocked()
	c, k, err := g.settleLocked(ctx, images)
	settled := g.kept.settledSinceLocked(before)
	g.kept.mu.Unlock()
	if err != nil {
		g.log.Warn("settling kept pull intents failed; they stay", "err", err)
	} else if c > 0 {
		g.log.Info("settled kept pull intents", "toRecords", c, "kept", k)
	}
	g.trackArrivedSince(ctx, images, settled)
}

// trackArrivedSince tracks, for each settled intent of a pull cut short,
// every image of its repository that has no record and was not known to
// be on the node before that pull began: the cut pull may have created it
// (containerd creates the image after its client's cancel) under the name
// as it was then, which a tag moved since no longer shows. images is the
// runtime's list; nil asks the runtime.
func (g *Guard) trackArrivedSince(ctx context.Context, images []crireq.Image, settled []keptIntent) {
	if len(settled) == 0 {
		return
	}
	if images == nil {
		var err error
		if images, err = g.runtime.Images(ctx); err != nil {
			g.log.Warn("listing the node's images after a cut pull was settled failed; the next GC run looks", "err", err)
			return
		}
	}
	for _, img := range images {
		if _, err := g.store.Get(img.ID); !errors.Is(err, ErrNotFound) || g.unrecorded.has(img.ID) {
			continue // a record (readable or not) decides it
		}
		for _, k := range settled {
			if !g.listedAs(k.repo, img.Names) {
				continue
			}
			if l, ok := g.store.Layers(img.ID); ok && l.Seen.Before(k.since) && g.layers.Observation.Observed() {
				continue // on the node before the cut pull began
			}
			g.track(ctx, img, "an image of a repository a cut pull was of appeared since: tracked as pulled with no verified credential; every pod must pull it",
				"not known on the node before the cut pull of "+k.repo+" began")
			break
		}
	}
}

// settlePulled settles the kept intents of image once a pull of it
// through the proxy succeeded and its record was written: the record
// tracks what the name stands for, so the intents of earlier pulls of it
// protect nothing more.
func (g *Guard) settlePulled(ctx context.Context, image string) {
	if !g.kept.any() {
		return
	}
	name, ok := imageref.Normalized(image)
	if !ok {
		return
	}
	g.kept.mu.Lock()
	before := g.kept.sinceLocked()
	g.settlePulledLocked(name)
	settled := g.kept.settledSinceLocked(before)
	g.kept.mu.Unlock()
	g.trackArrivedSince(ctx, nil, settled)
}

// settlePulledLocked drops the kept intents of the normalized name;
// g.kept.mu is held.
func (g *Guard) settlePulledLocked(name string) {
	keep := g.kept.list[:0:0]
	for _, in := range g.kept.list {
		if n, _ := imageref.Normalized(in.Image); n != name {
			keep = append(keep, in)
			continue
		}
		if err := g.store.DropIntent(in.ID); err != nil {
			keep = append(keep, in)
			continue
		}
		if repo, ok := imageref.Repository(in.Image); ok {
			g.pending.dec(repo)
		}
	}
	g.kept.setLocked(keep)
}

// listedID finds the image an intent names in the runtime's list (by
// normalized reference): by the intent's full reference or, when it has a
// digest, by repo@digest, which is how containerd lists a pull of
// repo:tag@digest. "" when it is not there.
func listedID(byName map[string]string, image string) string {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return ""
	}
	if id := byName[reference.TagNameOnly(named).String()]; id != "" {
		return id
	}
	if d, ok := named.(reference.Digested); ok {
		if c, err := reference.WithDigest(reference.TrimNamed(named), d.Digest()); err == nil {
			return byName[c.String()]
		}
	}
	return ""
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
	g.settleKept(ctx, images)
	if records, err = g.prune(images, until); err != nil {
		return 0, 0, err
	}
	g.observeLayers(ctx, images, listedAt, observeLimit)
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
