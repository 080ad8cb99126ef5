package ensure

import (
	"sync"
	"sync/atomic"
	"time"
)

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
