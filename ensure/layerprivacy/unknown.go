package layerprivacy

import (
	"sync"
	"time"
)

// Unknown holds the images tracked on the node (a record that
// restricts, or a pull that could not record) whose layers the runtime
// did not say, each with when it was found.
type Unknown struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// NewUnknown returns an empty table.
func NewUnknown() *Unknown {
	return &Unknown{m: map[string]time.Time{}}
}

// Add marks imageRef, found at at (the first mark stands).
func (u *Unknown) Add(imageRef string, at time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.m[imageRef]; !ok {
		u.m[imageRef] = at
	}
}

// Drop unmarks imageRef: its layers are known now.
func (u *Unknown) Drop(imageRef string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, imageRef)
}

// EarliestBut returns when the first image other than self with unknown
// layers was found; false when there is none.
func (u *Unknown) EarliestBut(self string) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	var first time.Time
	found := false
	for ref, at := range u.m {
		if ref != self && (!found || at.Before(first)) {
			first, found = at, true
		}
	}
	return first, found
}

// Retain drops the images keep refuses (gone from the node, as a list of
// its images taken at listedAt tells), marked before that list.
func (u *Unknown) Retain(keep func(imageRef string) bool, listedAt time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for ref, at := range u.m {
		if at.Before(listedAt) && !keep(ref) {
			delete(u.m, ref)
		}
	}
}
