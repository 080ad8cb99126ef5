package layerprivacy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Observation says whether a look at the node's images has succeeded:
// before one, what was on the node before the proxy cannot be told, so no
// image counts as preloaded and no layer as public. A look under way
// (Looking) is waited for (Await) by the decisions that need it.
type Observation struct {
	observed atomic.Bool
	// now is closed when observed turns true; looking counts the looks
	// under way, or about to run.
	now     chan struct{}
	looking atomic.Int32
}

// NewObservation returns a node not observed yet.
func NewObservation() *Observation { return &Observation{now: make(chan struct{})} }

// Observed reports whether a look at the node's images has succeeded.
func (o *Observation) Observed() bool { return o.observed.Load() }

// Looking says a look at the node's images is about to run, or runs:
// decisions wait for it (Await) until end is called.
func (o *Observation) Looking() (end func()) {
	o.looking.Add(1)
	var once sync.Once
	return func() { once.Do(func() { o.looking.Add(-1) }) }
}

// MarkObserved records a look that succeeded; it reports whether it was
// the first.
func (o *Observation) MarkObserved() bool {
	if !o.observed.CompareAndSwap(false, true) {
		return false
	}
	close(o.now)
	return true
}

// ObserveWait bounds a decision's wait for a look at the node's images
// that is under way (the daemon's first, over every image of the node).
const ObserveWait = time.Minute

// Await reports whether the node is observed, waiting (bounded by
// ObserveWait and ctx) for a look under way: a pull that comes while the
// daemon's first look runs (a restart on a node of many images, the
// kubelet pulling at once) decides what was there before with it, rather
// than without (no preloaded name, no public layer).
func (o *Observation) Await(ctx context.Context) bool {
	if o.observed.Load() {
		return true
	}
	if o.looking.Load() == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, ObserveWait)
	defer cancel()
	select {
	case <-o.now:
		return true
	case <-ctx.Done():
		return o.observed.Load()
	}
}
