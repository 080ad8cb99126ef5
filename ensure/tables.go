package ensure

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// grantTable holds, in memory, which pod (sandbox UID) may use which image
// ID: the pods whose pull of it was allowed. Losing it (a restart) costs a
// retry, never lets a pod in: CreateContainer is refused and the kubelet
// pulls again. It is safe for concurrent use.
type grantTable struct {
	mu   sync.Mutex
	pods map[string]map[string]time.Time // pod UID -> image ID -> when granted
}

func newGrantTable() *grantTable { return &grantTable{pods: map[string]map[string]time.Time{}} }

func (g *grantTable) grant(uid, imageRef string, now time.Time) {
	if uid == "" || imageRef == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pods[uid] == nil {
		g.pods[uid] = map[string]time.Time{}
	}
	g.pods[uid][imageRef] = now
}

func (g *grantTable) has(uid, imageRef string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.pods[uid][imageRef]
	return ok
}

func (g *grantTable) dropPod(uid string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pods, uid)
}

// dropImage removes every grant of imageRef (the image was removed).
func (g *grantTable) dropImage(imageRef string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for uid, imgs := range g.pods {
		delete(imgs, imageRef)
		if len(imgs) == 0 {
			delete(g.pods, uid)
		}
	}
}

// gc drops the grants of pods that no longer exist (alive returns false)
// and were granted before until.
func (g *grantTable) gc(alive func(uid string) bool, until time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for uid, imgs := range g.pods {
		if alive(uid) {
			continue
		}
		for ref, t := range imgs {
			if t.Before(until) {
				delete(imgs, ref)
				n++
			}
		}
		if len(imgs) == 0 {
			delete(g.pods, uid)
		}
	}
	return n
}

func (g *grantTable) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, imgs := range g.pods {
		n += len(imgs)
	}
	return n
}

// hideTable remembers the images ImageStatus just reported as absent,
// so that the PullImage the kubelet sends next may be answered from the
// node when its credential is already verified. A PullImage not preceded
// by a hide (the kubelet's Always policy, crictl) is always a real pull.
type hideTable struct {
	mu      sync.Mutex
	ttl     time.Duration
	max     int
	entries map[string]*hideEntry // image as requested -> hide
}

type hideEntry struct {
	imageRef string
	count    int // hides not yet followed by a pull
	expires  time.Time
}

func newHideTable(ttl time.Duration, max int) *hideTable {
	return &hideTable{ttl: ttl, max: max, entries: map[string]*hideEntry{}}
}

func (h *hideTable) add(image, imageRef string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[image]
	if e == nil || e.imageRef != imageRef || now.After(e.expires) {
		if e == nil && len(h.entries) >= h.max {
			h.evictLocked(now)
		}
		e = &hideEntry{imageRef: imageRef}
		h.entries[image] = e
	}
	e.count++
	e.expires = now.Add(h.ttl)
}

// peek returns the image ID hidden for image, if a hide is pending.
func (h *hideTable) peek(image string, now time.Time) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[image]
	if e == nil || e.count == 0 || now.After(e.expires) {
		return "", false
	}
	return e.imageRef, true
}

// take consumes one pending hide of image.
func (h *hideTable) take(image string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.entries[image]; e != nil {
		if e.count--; e.count <= 0 {
			delete(h.entries, image)
		}
	}
}

// forget drops every pending hide of image: the runtime says the name
// stands for no image now, so what it hid is no longer what a pull of it
// would find.
func (h *hideTable) forget(image string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.entries, image)
}

// evictLocked drops expired entries, or the one expiring soonest.
func (h *hideTable) evictLocked(now time.Time) {
	var victim string
	var soonest time.Time
	for k, e := range h.entries {
		if now.After(e.expires) {
			delete(h.entries, k)
			victim = ""
			continue
		}
		if victim == "" || e.expires.Before(soonest) {
			victim, soonest = k, e.expires
		}
	}
	if len(h.entries) >= h.max && victim != "" {
		delete(h.entries, victim)
	}
}

// pendingTable counts pulls in flight per repository: their images are
// "pulled by the proxy" before any record exists, as the kubelet counts
// its intents in memory.
type pendingTable struct {
	mu sync.Mutex
	n  map[string]int
}

func newPendingTable() *pendingTable { return &pendingTable{n: map[string]int{}} }

func (p *pendingTable) inc(repo string) {
	p.mu.Lock()
	p.n[repo]++
	p.mu.Unlock()
}

func (p *pendingTable) dec(repo string) {
	p.mu.Lock()
	if p.n[repo]--; p.n[repo] <= 0 {
		delete(p.n, repo)
	}
	p.mu.Unlock()
}

func (p *pendingTable) has(repo string) bool { return p.count(repo) > 0 }

func (p *pendingTable) count(repo string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[repo]
}

// verificationTable remembers, per image and repository, the registry's
// last word on a recorded credential, for records explain. Bounded: past
// its bound it forgets everything and starts again.
type verificationTable struct {
	mu  sync.Mutex
	max int
	m   map[string]map[string]Verification // image ID -> repository -> last
}

func newVerificationTable(max int) *verificationTable {
	return &verificationTable{max: max, m: map[string]map[string]Verification{}}
}

func (v *verificationTable) note(imageRef, repo string, w RegistryVerification, at time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m[imageRef] == nil {
		if len(v.m) >= v.max {
			clear(v.m)
		}
		v.m[imageRef] = map[string]Verification{}
	}
	v.m[imageRef][repo] = Verification{Repository: repo, RegistryVerification: w, At: at}
}

func (v *verificationTable) of(imageRef string) []Verification {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []Verification
	for _, w := range v.m[imageRef] {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Verification) int { return strings.Compare(a.Repository, b.Repository) })
	return out
}
