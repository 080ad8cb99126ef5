package records

import (
	"crypto/rand"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// bucketProbe holds ProbeWrite's value between its transactions, at
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

// ProbeWrite checks that the database takes writes, as a record write needs
// them, and changes no record, intent or counter. It commits three
// transactions: a small value, as small as an intent; then probePages
// pages of random bytes (which no filesystem compresses away), which,
// unless bbolt's free pages hold them, grow the file into space the
// filesystem must provide; then their deletion. Each commit is bbolt's,
// fsync and all: it fails where a record write would (ENOSPC, EROFS, EIO),
// and a commit that fails leaves the file as it was (bbolt writes the meta
// page last, only once the pages it points to are synced).
//
// The small write first: on a filesystem that takes no write at all (the
// kernel's read-only after an I/O error), it fails there, at the cost of
// an intent's write. The large one's growth of the file could need a
// larger mapping of it, which such a filesystem refuses, and bbolt then
// keeps none: reads would fail too, until the file is opened again.
func (s *Store) ProbeWrite() error {
	put := func(value []byte) error {
		return s.db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(bucketProbe)
			if err != nil {
				return err
			}
			return b.Put(keyProbe, value)
		})
	}
	drop := func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			if err := tx.DeleteBucket(bucketProbe); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
				return err
			}
			return nil
		})
	}
	if err := put([]byte{0}); err != nil {
		return fmt.Errorf("write probe: %w", err)
	}
	value := make([]byte, probePages*s.pageSize)
	if _, err := rand.Read(value); err != nil {
		return err
	}
	if err := put(value); err != nil {
		_ = drop() // the small value, if this one can be written
		return fmt.Errorf("write probe: %w", err)
	}
	if err := drop(); err != nil {
		return fmt.Errorf("write probe: deleting its value: %w", err)
	}
	return nil
}
