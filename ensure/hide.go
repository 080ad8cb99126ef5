package ensure

import "context"

// Hide reports whether a lookup of image by name, which the runtime
// answered with the present image imageID listed under names (its tags,
// its digests), must be answered "not present": the image needs
// verification and no pod waiting for it may be shown it. The kubelet
// then pulls (IfNotPresent), so the registry checks the pod's credential,
// or refuses (Never). A lookup by ID is never hidden: it carries no
// repository to decide on, and CreateContainer decides every ID.
func (g *Guard) Hide(ctx context.Context, image, imageID string, names ...[]string) bool {
	repo, ok := g.repository(image)
	if !ok || !g.listedAs(repo, names...) {
		return false
	}
	d := g.countedDecide(imageID, repo, g.parse(image).Lookup(), nil)
	if !d.verify {
		return false
	}
	if ok, why := g.entitlements.showToWaiters(ctx, image, imageID, repo); ok {
		g.logDecision(ctx, "ImageStatus: shown", image, imageID, "", why)
		return false
	}
	g.hidden.add(image, imageID, g.clock.Now())
	g.metrics.hidden.Inc()
	g.logDecision(ctx, "ImageStatus: hidden", image, imageID, "", d.rule)
	return true
}
