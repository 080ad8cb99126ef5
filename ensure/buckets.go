package ensure

import (
	bolt "go.etcd.io/bbolt"
)

// Bucket and key names; see the tree in doc.go.
var (
	bucketSchema  = []byte("v1")      // everything of schema v1
	bucketMeta    = []byte("meta")    // version, salt
	bucketRecords = []byte("records") // image ID -> ImagePulledRecord
	bucketIntents = []byte("intents") // intent ID -> ImagePullIntent

	keyVersion = []byte("version")
	keySalt    = []byte("salt")
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
