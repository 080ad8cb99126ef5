package records

import "sync"

// recordCache keeps decoded records of the hot images: ImageStatus and
// PullImage then need no transaction and no JSON decoding. Writes drop
// what they change. Records in it are shared: read them, never change them.
//
// A miss reads the file and then stores what it read; a write committed
// in between drops the cache before the store, which would then put the
// record as it was before the write back for good (a revoked credential
// re-used until the next write). Every drop therefore advances a
// generation, and a miss stores its record only if the generation it saw
// before its read is still current: a read that raced a write is served
// once, not cached.
type recordCache struct {
	mu  sync.RWMutex
	max int
	m   map[string]*Record
	gen uint64 // advanced by every drop
}

func (c *recordCache) get(ref string) (*Record, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.m[ref]
	return r, ok
}

// generation is taken before a miss reads the file, for put.
func (c *recordCache) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// put stores r, read after generation returned gen, unless a write has
// dropped anything since.
func (c *recordCache) put(ref string, r *Record, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.m) >= c.max {
		clear(c.m) // simple and rare: the hot set refills in a few calls
	}
	c.m[ref] = r
}

func (c *recordCache) drop(refs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for _, r := range refs {
		delete(c.m, r)
	}
}

func (c *recordCache) dropAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.m)
}
