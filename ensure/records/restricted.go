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

// takeOut decodes the record stored under imageRef in tx and notes its
// removal: it is about to be replaced or deleted. It returns nil when
// there is none, or it does not decode (its counts then stay, see
// replace).
func (d repoDelta) takeOut(tx *bolt.Tx, imageRef []byte) *Record {
	v := recordsBucket(tx).Get(imageRef)
	if v == nil {
		return nil
	}
	old, err := decodeRecord(imageRef, v)
	if err != nil {
		return nil
	}
	d.replace(old, nil)
	return old
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
