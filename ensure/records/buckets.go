package records

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Bucket and key names; see the tree in doc.go.
var (
	bucketSchema   = []byte("v1")       // everything of schema v1
	bucketMeta     = []byte("meta")     // version, salt
	bucketRecords  = []byte("records")  // image ID -> ImagePulledRecord
	bucketIntents  = []byte("intents")  // intent ID -> ImagePullIntent
	bucketRepos    = []byte("repos")    // repository -> how many records restrict it
	bucketUpdated  = []byte("updated")  // compact image ID -> when its record last changed (version 2)
	bucketVerified = []byte("verified") // image ID, repository, credential -> when it was last verified (version 3)
	bucketLayers   = []byte("layers")   // image ID -> when first seen, its layers' diff_ids (version 4)
	bucketVouched  = []byte("vouched")  // repository, diff_id, image ID -> when the repository vouched for the layer (version 4)
	// image ID -> its names before its first recorded pull (version 5)
	bucketPreloaded = []byte("preloaded")

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
func updatedBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketUpdated) }

// layersBucket and vouchedBucket may be nil in a read-only open of a
// version 3 file.
func layersBucket(tx *bolt.Tx) *bolt.Bucket  { return bucket(tx, bucketSchema, bucketLayers) }
func vouchedBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketVouched) }

// verifiedBucket may be nil in a read-only open of a version 2 file.
func verifiedBucket(tx *bolt.Tx) *bolt.Bucket { return bucket(tx, bucketSchema, bucketVerified) }

// verifiedKey is where the time a credential was last verified for
// imageRef as repo is kept: the three joined by NUL, which none contains.
func verifiedKey(imageRef, repo, credential string) []byte {
	return []byte(imageRef + "\x00" + repo + "\x00" + credential)
}

// delVerified deletes the verification times of imageRef's credentials.
func delVerified(tx *bolt.Tx, imageRef []byte) error {
	vb := verifiedBucket(tx)
	if vb == nil {
		return nil
	}
	prefix := append(bytes.Clone(imageRef), 0)
	var doomed [][]byte
	c := vb.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		doomed = append(doomed, bytes.Clone(k))
	}
	for _, k := range doomed {
		if err := vb.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

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

// putRecord stores a record's encoding under its image ID, with the time
// it changed in the updated index.
func putRecord(tx *bolt.Tx, imageRef, data []byte, updated time.Time) error {
	if err := put(tx, recordsBucket(tx), keyRecordsCount, imageRef, data); err != nil {
		return err
	}
	return updatedBucket(tx).Put(indexKey(imageRef), encodeTime(updated))
}

// delRecord deletes a record, its index entry, its verification times and
// its preloaded names; it reports whether there was a record.
func delRecord(tx *bolt.Tx, imageRef []byte) (bool, error) {
	found, err := del(tx, recordsBucket(tx), keyRecordsCount, imageRef)
	if err != nil {
		return false, err
	}
	if err := delVerified(tx, imageRef); err != nil {
		return false, err
	}
	if err := delPreloaded(tx, imageRef); err != nil {
		return false, err
	}
	return found, updatedBucket(tx).Delete(indexKey(imageRef))
}

// indexKey is an image ID as the updated index stores it: a sha256 digest
// as its 32 bytes after a 1, anything else as its text after a 0. Image IDs
// are sha256 digests in practice, and the short key keeps the index, read
// whole by every garbage collection, at ~60 bytes per record.
func indexKey(imageRef []byte) []byte {
	if len(imageRef) == len("sha256:")+64 && bytes.HasPrefix(imageRef, []byte("sha256:")) {
		raw := make([]byte, 33)
		raw[0] = 1
		if _, err := hex.Decode(raw[1:], imageRef[len("sha256:"):]); err == nil && bytes.Equal(bytes.ToLower(imageRef), imageRef) {
			return raw
		}
	}
	return append([]byte{0}, imageRef...)
}

// imageRefOf inverts indexKey.
func imageRefOf(key []byte) string {
	if len(key) == 33 && key[0] == 1 {
		return "sha256:" + hex.EncodeToString(key[1:])
	}
	if len(key) > 0 {
		return string(key[1:])
	}
	return ""
}

// encodeTime and decodeTime are the updated index's values: Unix
// nanoseconds, big-endian. A value that does not decode is the zero time
// (old).
func encodeTime(t time.Time) []byte {
	if t.IsZero() {
		return make([]byte, 8)
	}
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))
}

func decodeTime(v []byte) time.Time {
	if len(v) != 8 || binary.BigEndian.Uint64(v) == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v)))
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
