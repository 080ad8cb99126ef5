package ensure

import (
	"hash/maphash"
	"sync"
)

// refLocks serialise what must not interleave for one image ID: recording
// a finished pull, and RemoveImage's "is it gone? then forget its record".
// Without them a pull finishing between that check and the forget would
// leave the image present and its record gone: a preloaded image, to
// every pod. Striped: two IDs may share a lock, which only costs a wait.
type refLocks struct {
	seed    maphash.Seed
	stripes [64]sync.Mutex
}

func newRefLocks() *refLocks { return &refLocks{seed: maphash.MakeSeed()} }

// lock locks imageRef's stripe and returns its unlock.
func (l *refLocks) lock(imageRef string) (unlock func()) {
	m := &l.stripes[maphash.String(l.seed, imageRef)%uint64(len(l.stripes))]
	m.Lock()
	return m.Unlock
}
