package ensure

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/reference"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// The intents kept until their outcome is known, and the ledger's
// settling of them: at start (Recover), before each look at the node
// (settleKept), and once a later pull of the same name is recorded
// (settlePulled).

// keptIntents are the pull intents not settled yet: those a crash left
// (found at start, settled by Recover), and those kept in this daemon's
// life because a pull's outcome was not known (its runtime pull cut short,
// the runtime silent, a write that failed). Until settled, each counts as
// a pull in flight of its repository (pending), so that its images are
// never taken for preloaded ones.
type keptIntents struct {
	pending *pendingTable
	// mu guards list and since; count mirrors len(list), read without it.
	mu    sync.Mutex
	list  []Intent
	count atomic.Int64
	// since are the intents kept in this life because a runtime's pull was
	// cut short, with their pull's repository and start.
	since map[string]keptIntent
}

// keptIntent is an intent kept in this daemon's life: its pull's
// repository, and when that pull began.
type keptIntent struct {
	repo  string
	since time.Time
}

// keep keeps a pull's intent whose outcome is not known: like those a
// crash left, it counts as a pull in flight of repo until a GC run (or the
// next start) finds what its image is, or a later pull of it settles.
//
// since is when the pull began, for an intent kept because the runtime's
// pull was cut short (the zero time otherwise): whatever image of its
// repository appears on the node from then on may be the cut pull's.
func (k *keptIntents) keep(in Intent, repo string, since time.Time) {
	if in.ID == "" {
		return // none was written: the runtime was never asked
	}
	k.pending.inc(repo)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setLocked(append(k.list, in))
	if !since.IsZero() {
		if k.since == nil {
			k.since = map[string]keptIntent{}
		}
		k.since[in.ID] = keptIntent{repo: repo, since: since}
	}
}

// setLocked replaces the kept intents; k.mu is held (or k is not shared
// yet).
func (k *keptIntents) setLocked(in []Intent) {
	k.list = in
	k.count.Store(int64(len(in)))
}

// any reports, without a lock when there is none, whether intents are
// still unsettled.
func (k *keptIntents) any() bool { return k.count.Load() > 0 }

// sinceLocked is a copy of the intents kept in this daemon's life, by
// ID, with when their pull began; k.mu is held.
func (k *keptIntents) sinceLocked() map[string]keptIntent {
	out := make(map[string]keptIntent, len(k.since))
	for id, ki := range k.since {
		out[id] = ki
	}
	return out
}

// settledSinceLocked returns those of before no longer kept (settled),
// and forgets them; k.mu is held.
func (k *keptIntents) settledSinceLocked(before map[string]keptIntent) []keptIntent {
	kept := map[string]bool{}
	for _, in := range k.list {
		kept[in.ID] = true
	}
	var out []keptIntent
	for id, ki := range before {
		if !kept[id] {
			out = append(out, ki)
			delete(k.since, id)
		}
	}
	return out
}

// settleLocked converts the kept intents whose image is in images and
// keeps the others. l.kept.mu is held.
func (l *ledger) settleLocked(ctx context.Context, images []crireq.Image) (converted, kept int, err error) {
	byName := map[string]string{} // normalized reference -> image ID
	for _, img := range images {
		for _, r := range img.Names {
			if n, ok := imageref.Normalized(r); ok {
				byName[n] = img.ID
			}
		}
	}
	var keep []Intent
	for i, in := range l.kept.list {
		ref := listedID(byName, in.Image)
		repo, _ := imageref.Repository(in.Image)
		switch {
		case repo == "":
			err = l.store.DropIntent(in.ID)
		case ref == "":
			keep = append(keep, in)
			continue
		default:
			// No preloaded names: what the image was listed under before
			// the interrupted pull is not known (those names verify).
			err = l.store.RecordPull(ref, repo, Credential{}, in.ID, l.clock.Now(), nil)
			if err == nil {
				l.keepLayers(ctx, ref, true)
				l.log.Info("a pull was interrupted; its image needs verification by every pod", "image", in.Image, "imageRef", ref)
				converted++
			}
		}
		if err != nil {
			l.kept.setLocked(append(keep, l.kept.list[i:]...))
			return converted, len(l.kept.list), err
		}
		if repo != "" {
			l.pending.dec(repo)
		}
	}
	l.kept.setLocked(keep)
	return converted, len(keep), nil
}

// settleKept settles the kept intents whose image images (the runtime's
// list) shows: before any look decides what the node's images are, so
// that an image a cut pull or a crash left is tracked, with its layers,
// never taken for one that was there before.
func (l *ledger) settleKept(ctx context.Context, images []crireq.Image) {
	if !l.kept.any() {
		return
	}
	l.kept.mu.Lock()
	before := l.kept.sinceLocked()
	c, k, err := l.settleLocked(ctx, images)
	settled := l.kept.settledSinceLocked(before)
	l.kept.mu.Unlock()
	if err != nil {
		l.log.Warn("settling kept pull intents failed; they stay", "err", err)
	} else if c > 0 {
		l.log.Info("settled kept pull intents", "toRecords", c, "kept", k)
	}
	l.trackArrivedSince(ctx, images, settled)
}

// trackArrivedSince tracks, for each settled intent of a pull cut short,
// every image of its repository that has no record and was not known to
// be on the node before that pull began: the cut pull may have created it
// (containerd creates the image after its client's cancel) under the name
// as it was then, which a tag moved since no longer shows. images is the
// runtime's list; nil asks the runtime.
func (l *ledger) trackArrivedSince(ctx context.Context, images []crireq.Image, settled []keptIntent) {
	if len(settled) == 0 {
		return
	}
	if images == nil {
		var err error
		if images, err = l.runtime.Images(ctx); err != nil {
			l.log.Warn("listing the node's images after a cut pull was settled failed; the next GC run looks", "err", err)
			return
		}
	}
	for _, img := range images {
		if _, err := l.store.Get(img.ID); !errors.Is(err, ErrNotFound) || l.unrecorded.has(img.ID) {
			continue // a record (readable or not) decides it
		}
		for _, k := range settled {
			if !l.listedAs(k.repo, img.Names) {
				continue
			}
			if known, ok := l.store.Layers(img.ID); ok && known.Seen.Before(k.since) && l.layers.Observation.Observed() {
				continue // on the node before the cut pull began
			}
			l.track(ctx, img, "an image of a repository a cut pull was of appeared since: tracked as pulled with no verified credential; every pod must pull it",
				"not known on the node before the cut pull of "+k.repo+" began")
			break
		}
	}
}

// settlePulled settles the kept intents of image once a pull of it
// through the proxy succeeded and its record was written: the record
// tracks what the name stands for, so the intents of earlier pulls of it
// protect nothing more.
func (l *ledger) settlePulled(ctx context.Context, image string) {
	if !l.kept.any() {
		return
	}
	name, ok := imageref.Normalized(image)
	if !ok {
		return
	}
	l.kept.mu.Lock()
	before := l.kept.sinceLocked()
	l.settlePulledLocked(name)
	settled := l.kept.settledSinceLocked(before)
	l.kept.mu.Unlock()
	l.trackArrivedSince(ctx, nil, settled)
}

// settlePulledLocked drops the kept intents of the normalized name;
// l.kept.mu is held.
func (l *ledger) settlePulledLocked(name string) {
	keep := l.kept.list[:0:0]
	for _, in := range l.kept.list {
		if n, _ := imageref.Normalized(in.Image); n != name {
			keep = append(keep, in)
			continue
		}
		if err := l.store.DropIntent(in.ID); err != nil {
			keep = append(keep, in)
			continue
		}
		if repo, ok := imageref.Repository(in.Image); ok {
			l.pending.dec(repo)
		}
	}
	l.kept.setLocked(keep)
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
