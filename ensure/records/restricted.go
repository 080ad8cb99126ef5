package records

import (
	"encoding/binary"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// restrictedOf lists the repositories a record restricts: those whose
// mapping is not accessible to every pod of the node.
func restrictedOf(r *Record) []string {
	if r == nil {
		return nil
	}
	var out []string
	for repo, c := range r.CredentialMapping {
		if !c.NodePodsAccessible {
			out = append(out, repo)
		}
	}
	return out
}

// repoDelta is how a transaction changes the repos index.
type repoDelta map[string]int

// replace notes a record changing from old to new; either may be nil. An
// old record that could not be decoded is passed as nil: its counts are
// not taken back, which can only overstate a restriction (safe).
func (d repoDelta) replace(old, new *Record) {
	for _, r := range restrictedOf(old) {
		d[r]--
	}
	for _, r := range restrictedOf(new) {
		d[r]++
	}
}

// apply writes the delta to the repos bucket in tx.
func (d repoDelta) apply(tx *bolt.Tx) error {
	b := reposBucket(tx)
	for repo, delta := range d {
		if delta == 0 {
			continue
		}
		n, _ := binary.Uvarint(b.Get([]byte(repo)))
		v := int(n) + delta
		if v <= 0 {
			if err := b.Delete([]byte(repo)); err != nil {
				return err
			}
			continue
		}
		if err := b.Put([]byte(repo), binary.AppendUvarint(nil, uint64(v))); err != nil {
			return err
		}
	}
	return nil
}

// repoIndex is the in-memory copy of the repos bucket.
type repoIndex struct {
	mu sync.RWMutex
	n  map[string]int
}

func (x *repoIndex) load(tx *bolt.Tx) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.n = map[string]int{}
	return reposBucket(tx).ForEach(func(k, v []byte) error {
		n, _ := binary.Uvarint(v)
		x.n[string(k)] = int(n)
		return nil
	})
}

// commit applies a delta that was committed to the file.
func (x *repoIndex) commit(d repoDelta) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for repo, delta := range d {
		if x.n[repo] += delta; x.n[repo] <= 0 {
			delete(x.n, repo)
		}
	}
}

func (x *repoIndex) restricted(repo string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.n[repo] > 0
}

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
