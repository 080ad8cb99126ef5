package ensure

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/distribution/reference"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Recover settles the intents a crash left behind (those found when the
// guard was made), as the kubelet does at start: an intent whose image is
// present becomes a record with no credential for its repository (every
// pod must verify), any other intent is dropped. Until it succeeds, their
// repositories count as pulls in flight. Call it before serving, and again
// if it fails.
func (g *Guard) Recover(ctx context.Context) (converted, dropped int, err error) {
	g.leftoverMu.Lock()
	defer g.leftoverMu.Unlock()
	if len(g.leftover) == 0 {
		return 0, 0, nil
	}
	list, err := g.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return 0, 0, fmt.Errorf("settling %d pull intents: list images: %w", len(g.leftover), err)
	}
	byName := map[string]string{} // normalized reference -> image ID
	for _, img := range list.GetImages() {
		for _, refs := range [][]string{img.GetRepoTags(), img.GetRepoDigests()} {
			for _, r := range refs {
				if n, ok := normalizedRef(r); ok {
					byName[n] = img.GetId()
				}
			}
		}
	}
	for len(g.leftover) > 0 {
		in := g.leftover[0]
		ref := listedID(byName, in.Image)
		repo, _ := Repository(in.Image)
		if ref == "" || repo == "" {
			if err := g.store.DropIntent(in.ID); err != nil {
				return converted, dropped, err
			}
			dropped++
		} else {
			if err := g.store.RecordPull(ref, repo, Credential{}, in.ID, g.clock.Now()); err != nil {
				return converted, dropped, err
			}
			g.log.Info("a pull was interrupted; its image needs verification by every pod", "image", in.Image, "imageRef", ref)
			converted++
		}
		if repo != "" {
			g.pending.dec(repo)
		}
		g.leftover = g.leftover[1:]
	}
	return converted, dropped, nil
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

// normalizedRef is a reference's full normalized form, with the default
// tag when it has neither tag nor digest.
func normalizedRef(s string) (string, bool) {
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return "", false
	}
	return reference.TagNameOnly(named).String(), true
}

// GC drops the records of images the runtime no longer lists and the
// grants of pods it no longer runs, both older than the grace period. When
// the runtime cannot be asked, nothing is dropped.
func (g *Guard) GC(ctx context.Context) (records, grants int, err error) {
	until := g.clock.Now().Add(-g.grace)
	list, err := g.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return 0, 0, fmt.Errorf("gc: list images: %w", err)
	}
	present := map[string]bool{}
	for _, img := range list.GetImages() {
		present[img.GetId()] = true
	}
	if records, err = g.store.Prune(func(ref string) bool { return present[ref] }, until); err != nil {
		return 0, 0, fmt.Errorf("gc: %w", err)
	}
	pods, err := g.sandboxes.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return records, 0, fmt.Errorf("gc: list pod sandboxes: %w", err)
	}
	alive := map[string]bool{}
	for _, p := range pods.GetItems() {
		alive[p.GetMetadata().GetUid()] = true
	}
	grants = g.grants.gc(func(uid string) bool { return alive[uid] }, until)
	// A run decodes the runtime's whole image and sandbox lists (a few MiB
	// on a busy node), garbage the moment it ends. With the daemon's GOGC
	// of 300 the heap would keep that room for minutes: measured +8 MiB
	// RSS after a run with 1,000 images. Give it back now; this costs one
	// collection of a small heap every gcInterval.
	debug.FreeOSMemory()
	return records, grants, nil
}

// Run collects garbage every interval until ctx is done.
func (g *Guard) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if r, gr, err := g.GC(ctx); err != nil {
				g.log.Warn("ensure garbage collection failed; nothing was dropped", "err", err)
			} else if r+gr > 0 {
				g.log.Info("ensure garbage collection", "records", r, "grants", gr)
			}
		}
	}
}
