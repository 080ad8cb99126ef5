package ensure

import (
	"encoding/binary"

	bolt "go.etcd.io/bbolt"
)

// Bucket and key names; see the tree in doc.go.
var (
	bucketSchema  = []byte("v1")      // everything of schema v1
	bucketMeta    = []byte("meta")    // version, salt
	bucketRecords = []byte("records") // image ID -> ImagePulledRecord
	bucketIntents = []byte("intents") // intent ID -> ImagePullIntent
	bucketRepos   = []byte("repos")   // repository -> how many records restrict it

	keyVersion      = []byte("version")
	keySalt         = []byte("salt")
	keyRecordsCount = []byte("records")
	keyIntentsCount = []byte("intents")
)

// bucket returns the bucket at path below the root, or nil.
func bucket(tx *bolt.Tx, path ...[]byte) *bolt.Bucket {
	b := tx.Bucket(path[0])
	for _, p := range path[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket(p)
	}
	return b
}

// createBucket returns the bucket at path below the root, creating what is
// missing.
func createBucket(tx *bolt.Tx, path ...[]byte) (*bolt.Bucket, error) {
	b, err := tx.CreateBucketIfNotExists(path[0])
	if err != nil {
		return nil, err
	}
	for _, p := range path[1:] {
		if b, err = b.CreateBucketIfNotExists(p); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func recordsBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketRecords) }
func intentsBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketIntents) }
func metaBucket(tx *bolt.Tx) *bolt.Bucket    { return bucket(tx, bucketSchema, bucketMeta) }
func reposBucket(tx *bolt.Tx) *bolt.Bucket   { return bucket(tx, bucketSchema, bucketRepos) }

// count returns a counter of the meta bucket.
func count(tx *bolt.Tx, key []byte) int {
	n, _ := binary.Uvarint(metaBucket(tx).Get(key))
	return int(n)
}

// addCount adds delta to a counter of the meta bucket, in tx: counts stay
// exact without walking the buckets (which would read the whole file).
func addCount(tx *bolt.Tx, key []byte, delta int) error {
	if delta == 0 {
		return nil
	}
	n := count(tx, key) + delta
	if n < 0 {
		n = 0
	}
	return metaBucket(tx).Put(key, binary.AppendUvarint(nil, uint64(n)))
}

// put stores a value in b, counting a new key under counter.
func put(tx *bolt.Tx, b *bolt.Bucket, counter, k, v []byte) error {
	isNew := b.Get(k) == nil
	if err := b.Put(k, v); err != nil {
		return err
	}
	if isNew {
		return addCount(tx, counter, 1)
	}
	return nil
}

// del deletes a key of b, counting it under counter when it was there.
func del(tx *bolt.Tx, b *bolt.Bucket, counter, k []byte) (bool, error) {
	if b.Get(k) == nil {
		return false, nil
	}
	if err := b.Delete(k); err != nil {
		return false, err
	}
	return true, addCount(tx, counter, -1)
}
