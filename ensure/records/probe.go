package records

import (
	"crypto/rand"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// bucketProbe holds ProbeWrite's value between its two transactions, at
// the root, outside the schema: no record, intent or counter is near it,
// and a value a crash left there costs its pages and nothing else (the
// next probe replaces it, then deletes it).
var (
	bucketProbe = []byte("write-probe")
	keyProbe    = []byte("probe")
)

// probePages is the size of ProbeWrite's value, in pages. A record write
// allocates 4 to 11 pages (measured with 2 to 20,000 records); the value
// alone takes more, and contiguous, so that a probe that succeeds without
// new space from the filesystem had free pages enough for a record write.
const probePages = 16

// ProbeWrite checks that the database takes writes, as a record write
// needs them, and changes no record, intent or counter. It commits two
// transactions: the first writes probePages pages of random bytes (which
// no filesystem compresses away) and so, unless bbolt's free pages hold
// them, grows the file into space the filesystem must provide; the second
// deletes them. Each commit is bbolt's, fsync and all: it fails where a
// record write would (ENOSPC, EROFS, EIO), and a commit that fails leaves
// the file as it was (bbolt writes the meta page last, only after the
// pages it points to are synced).
func (s *Store) ProbeWrite() error {
	value := make([]byte, probePages*s.db.Info().PageSize)
	if _, err := rand.Read(value); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketProbe)
		if err != nil {
			return err
		}
		return b.Put(keyProbe, value)
	})
	if err != nil {
		return fmt.Errorf("write probe: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketProbe); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write probe: deleting its value: %w", err)
	}
	return nil
}
