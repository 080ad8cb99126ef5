package records

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// baseVersion is the first version of the database layout. Every change
// to the tree in doc.go adds a migration to the next version, and its test.
const baseVersion = 1

// migration brings a database from version-1 to version.
type migration struct {
	version int
	migrate func(*bolt.Tx) error
}

// migrations, in order. A migration test MUST be added for each (see
// TestMigrations).
var migrations = []migration{
	{version: 2, migrate: indexUpdateTimes},
	{version: 3, migrate: addVerified},
	{version: 4, migrate: addLayers},
	{version: 5, migrate: addPreloadedBucket},
}

// addPreloadedBucket (version 5) adds the bucket of the names each image
// was listed under before its first recorded pull (PreloadedRecord). It
// starts empty: what an image recorded before was listed under then is
// not known, so those names stay as they were (a name of a repository the
// image was pulled as with credentials needs verification); no name is
// made free that was not.
func addPreloadedBucket(tx *bolt.Tx) error {
	_, err := createBucket(tx, bucketSchema, bucketPreloaded)
	return err
}

// addVerified (version 3) adds the bucket of each credential's last
// verification, for records that expire (maxRecordAge). It starts empty:
// a credential verified before has no time, and where records expire it
// is verified again (on any doubt, verify).
func addVerified(tx *bolt.Tx) error {
	_, err := createBucket(tx, bucketSchema, bucketVerified)
	return err
}

// indexUpdateTimes (version 2) fills the updated bucket from the records,
// so that garbage collection reads the small index instead of every record
// (which kept the whole file in the daemon's memory after each run).
func indexUpdateTimes(tx *bolt.Tx) error {
	ub := updatedBucket(tx)
	return recordsBucket(tx).ForEach(func(k, v []byte) error {
		var t time.Time // an undecodable record counts as old
		if r, err := decodeRecord(k, v); err == nil {
			t = r.LastUpdatedTime.Time
		}
		return ub.Put(indexKey(k), encodeTime(t))
	})
}

// errNewerDatabase is returned for a file written by a newer build: it is
// left untouched rather than misread.
var errNewerDatabase = errors.New("the database was written by a newer cri-image-proxy")

// initialize creates the buckets of a new file, or brings an older one to
// the latest version with the migrations; all in tx, so that a failure changes
// nothing.
func initialize(tx *bolt.Tx, migs []migration, newSalt func() ([]byte, error)) error {
	meta, err := createBucket(tx, bucketSchema, bucketMeta)
	if err != nil {
		return err
	}
	for _, b := range [][]byte{bucketRecords, bucketIntents, bucketRepos, bucketUpdated, bucketVerified, bucketLayers, bucketVouched, bucketPreloaded} {
		if _, err := createBucket(tx, bucketSchema, b); err != nil {
			return err
		}
	}
	if meta.Get(keySalt) == nil {
		salt, err := newSalt()
		if err != nil {
			return err
		}
		if err := meta.Put(keySalt, salt); err != nil {
			return err
		}
	}
	// The version is written with the buckets, in one transaction: a file
	// without it is new.
	version := latest(migs)
	if v := meta.Get(keyVersion); v != nil {
		n, k := binary.Uvarint(v)
		if k <= 0 {
			return fmt.Errorf("meta/version is not a number")
		}
		version = int(n)
	}
	if version > latest(migs) {
		return fmt.Errorf("%w (version %d; this build knows up to %d)", errNewerDatabase, version, latest(migs))
	}
	for _, m := range migs {
		if m.version > version {
			if err := m.migrate(tx); err != nil {
				return fmt.Errorf("migration to version %d: %w", m.version, err)
			}
			version = m.version
		}
	}
	return meta.Put(keyVersion, binary.AppendUvarint(nil, uint64(version)))
}

// latest is the version the migrations lead to.
func latest(migs []migration) int {
	if len(migs) == 0 {
		return baseVersion
	}
	return migs[len(migs)-1].version
}
