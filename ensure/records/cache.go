package records

import "sync"

// recordCache keeps decoded records of the hot images: ImageStatus and
// PullImage then need no transaction and no JSON decoding. Writes drop
// what they change. Records in it are shared: read them, never change them.
type recordCache struct {
	mu  sync.RWMutex
	max int
	m   map[string]*Record
}

func (c *recordCache) get(ref string) (*Record, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.m[ref]
	return r, ok
}

func (c *recordCache) put(ref string, r *Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m) // simple and rare: the hot set refills in a few calls
	}
	c.m[ref] = r
}

func (c *recordCache) drop(refs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		delete(c.m, r)
	}
}

func (c *recordCache) dropAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
}
