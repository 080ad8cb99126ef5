package records

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	digest "github.com/opencontainers/go-digest"
	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	kjson "sigs.k8s.io/json"
)

var (
	// ErrNotFound is returned for an image ID without a record.
	ErrNotFound = errors.New("no record")
	// ErrInvalidImageRef is returned for an image ID that is not a digest.
	ErrInvalidImageRef = errors.New("image ID is not a digest")
)

// Options configure Open.
type Options struct {
	// OpenTimeout bounds the wait for another process's lock on the file.
	// Default 2s.
	OpenTimeout time.Duration
	// ReadOnly opens the file without writing (for tools).
	ReadOnly bool
}

// Store is the bbolt database of records and intents. It is safe for
// concurrent use.
type Store struct {
	db   *bolt.DB
	salt []byte
	path string
	// pageSize is the file's, read at open: bbolt's Info panics once a
	// failed remap left the file unmapped.
	pageSize int
	repos    repoIndex
	cache    recordCache
	layers   layerIndex
	// preloaded is the preloaded bucket in memory (preloaded.go).
	preloaded preloadedIndex

	// afterRead, when set (by tests only), runs between a cache miss's
	// read and its store into the cache: the window a write can race.
	afterRead func()
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Path returns the file's path.
func (s *Store) Path() string { return s.path }

// validImageRef checks that ref is a digest, as CRI image IDs are.
func validImageRef(ref string) error {
	if _, err := digest.Parse(ref); err != nil {
		return fmt.Errorf("%w: %q: %v", ErrInvalidImageRef, ref, err)
	}
	return nil
}

// decodeRecord decodes a record strictly and checks it belongs to key, as
// the kubelet does: a record under the wrong key is no record.
func decodeRecord(key, data []byte) (*Record, error) {
	r := &Record{}
	if err := decodeKeyed("record", key, data, r, &r.ImageRef); err != nil {
		return nil, err
	}
	return r, nil
}

// decodeKeyed decodes data into v strictly (an unknown or duplicate field
// is an error, as in the kubelet's own reads) and refuses a record whose
// image, *imageRef once decoded, is not its key. what names the kind in
// errors.
func decodeKeyed(what string, key, data []byte, v any, imageRef *string) error {
	strict, err := kjson.UnmarshalStrict(data, v)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, key, err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("%s %s: %w", what, key, errors.Join(strict...))
	}
	if *imageRef != string(key) {
		return fmt.Errorf("%s %s: holds image %q", what, key, *imageRef)
	}
	return nil
}

func encodeRecord(r *Record) ([]byte, error) {
	r.APIVersion, r.Kind = kubeletconfigv1beta1.SchemeGroupVersion.String(), "ImagePulledRecord"
	return json.Marshal(r)
}

// storeRecord encodes r and stores it under its image ID, changed at
// updated.
func storeRecord(tx *bolt.Tx, r *Record, updated time.Time) error {
	data, err := encodeRecord(r)
	if err != nil {
		return err
	}
	return putRecord(tx, []byte(r.ImageRef), data, updated)
}

// Get returns the record of an image ID, or ErrNotFound. The record may be
// shared with other callers: do not change it.
func (s *Store) Get(imageRef string) (*Record, error) {
	if r, ok := s.cache.get(imageRef); ok {
		return r, nil
	}
	gen := s.cache.generation() // before the read: see recordCache
	var r *Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := recordsBucket(tx).Get([]byte(imageRef))
		if v == nil {
			return fmt.Errorf("image %s: %w", imageRef, ErrNotFound)
		}
		var err error
		r, err = decodeRecord([]byte(imageRef), v)
		return err
	})
	if s.afterRead != nil {
		s.afterRead()
	}
	if err == nil {
		s.cache.put(imageRef, r, gen)
	}
	return r, err
}

// Restricted reports whether some record restricts repo: has a mapping for
// it that is not accessible to every pod of the node. It reads memory only.
func (s *Store) Restricted(repo string) bool { return s.repos.restricted(repo) }

// write runs f in a write transaction and, once it is committed, applies
// its change of the repos index to memory and drops the cached records
// it names (all of them when drop is nil).
func (s *Store) write(f func(tx *bolt.Tx, d repoDelta) (drop []string, err error)) error {
	d := repoDelta{}
	var drop []string
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if drop, err = f(tx, d); err != nil {
			return err
		}
		return d.apply(tx)
	})
	if err != nil {
		return err
	}
	s.repos.commit(d)
	if drop == nil {
		s.cache.dropAll()
	} else {
		s.cache.drop(drop...)
	}
	return nil
}

// HashAuth returns the salted hash of a request's credential in this
// database, "" for a request without one.
func (s *Store) HashAuth(a Auth) string { return hashAuth(s.salt, a) }

// AddIntent durably notes that image is about to be pulled.
func (s *Store) AddIntent(image string) (string, error) {
	id := make([]byte, 12)
	if _, err := rand.Read(id); err != nil {
		return "", err
	}
	key := time.Now().UTC().Format("20060102T150405.000000000Z") + "-" + hex.EncodeToString(id)
	data, err := json.Marshal(&kubeletconfigv1beta1.ImagePullIntent{
		TypeMeta: metav1.TypeMeta{APIVersion: kubeletconfigv1beta1.SchemeGroupVersion.String(), Kind: "ImagePullIntent"},
		Image:    image,
	})
	if err != nil {
		return "", err
	}
	err = s.db.Update(func(tx *bolt.Tx) error { return put(tx, intentsBucket(tx), keyIntentsCount, []byte(key), data) })
	if err != nil {
		return "", fmt.Errorf("write pull intent for %s: %w", image, err)
	}
	return key, nil
}

// DropIntent removes an intent (the pull failed).
func (s *Store) DropIntent(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		_, err := del(tx, intentsBucket(tx), keyIntentsCount, []byte(id))
		return err
	})
}

// Intents returns the intents on disk.
func (s *Store) Intents() ([]Intent, error) {
	var out []Intent
	err := s.db.View(func(tx *bolt.Tx) error {
		return intentsBucket(tx).ForEach(func(k, v []byte) error {
			var in kubeletconfigv1beta1.ImagePullIntent
			if _, err := kjson.UnmarshalStrict(v, &in); err != nil {
				// An undecodable intent still stands for a pull: keep it visible.
				out = append(out, Intent{ID: string(k)})
				return nil
			}
			out = append(out, Intent{ID: string(k), Image: in.Image})
			return nil
		})
	})
	return out, err
}

// RecordPull adds cred to the record of imageRef for repo and drops the
// intent intentID (if any), in one committed transaction. When imageRef
// has no record yet (none at all: one that does not decode counts as
// one), preloaded are the names the runtime listed the image under before
// this pull, and are kept as its PreloadedRecord in the same transaction:
// the image was on the node, free to every pod by those names, before the
// proxy pulled it. With a record they are ignored: names that appeared
// since may be an earlier puller's.
func (s *Store) RecordPull(imageRef, repo string, cred Credential, intentID string, now time.Time, preloaded []string) error {
	return s.recordPull(imageRef, repo, cred, intentID, now, preloaded, nil)
}

// recordPull is RecordPull with also, in its transaction, what with adds.
func (s *Store) recordPull(imageRef, repo string, cred Credential, intentID string, now time.Time, preloaded []string, with func(*bolt.Tx) error) error {
	if err := validImageRef(imageRef); err != nil {
		return err
	}
	var names []string
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		first := recordsBucket(tx).Get([]byte(imageRef)) == nil
		// An undecodable record is replaced: the new one is safe, and it
		// forgets only credentials that could not be read anyway.
		r := d.takeOut(tx, []byte(imageRef))
		if r == nil {
			r = &Record{ImageRef: imageRef}
		}
		MergeCredential(r, repo, cred)
		d.replace(nil, r)
		r.LastUpdatedTime = metav1.NewTime(now)
		if err := storeRecord(tx, r, now); err != nil {
			return nil, err
		}
		if first {
			var err error
			if names, err = addPreloaded(tx, imageRef, preloaded, r.LastUpdatedTime); err != nil {
				return nil, err
			}
		}
		if vb := verifiedBucket(tx); vb != nil {
			for _, k := range CredentialKeys(cred) {
				if err := vb.Put(verifiedKey(imageRef, repo, k), encodeTime(now)); err != nil {
					return nil, err
				}
			}
		}
		if intentID != "" {
			if _, err := del(tx, intentsBucket(tx), keyIntentsCount, []byte(intentID)); err != nil {
				return nil, err
			}
		}
		if with != nil {
			if err := with(tx); err != nil {
				return nil, err
			}
		}
		return []string{imageRef}, nil
	})
	if err == nil && names != nil {
		s.preloaded.set(imageRef, names)
	}
	return err
}

// VerifiedAt returns when the credential named key (CredentialKeys) was
// last verified for imageRef as repo; false when no time is kept (a
// credential verified before version 3, or never).
func (s *Store) VerifiedAt(imageRef, repo, key string) (time.Time, bool, error) {
	var t time.Time
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		if vb := verifiedBucket(tx); vb != nil {
			if v := vb.Get(verifiedKey(imageRef, repo, key)); v != nil {
				t, ok = decodeTime(v), true
			}
		}
		return nil
	})
	return t, ok, err
}

// Forget deletes the record of imageRef, and its preloaded names; it
// reports whether there was a record.
func (s *Store) Forget(imageRef string) (bool, error) {
	found := false
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		old := d.takeOut(tx, []byte(imageRef))
		if err := delVouched(tx, []byte(imageRef), old); err != nil {
			return nil, err
		}
		var err error
		found, err = delRecord(tx, []byte(imageRef))
		return []string{imageRef}, err
	})
	if err == nil {
		s.preloaded.set(imageRef, nil)
	}
	return found, err
}

// update applies f to every record, writes those it changed (f returns
// true) in one transaction, and returns their image IDs.
func (s *Store) update(now time.Time, f func(*Record) bool) ([]string, error) {
	var refs []string
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		rb := recordsBucket(tx)
		type change struct{ k, v []byte }
		var changes []change
		err := rb.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil {
				return nil
			}
			d.replace(r, nil)
			changed := f(r)
			d.replace(nil, r) // cancels out when unchanged
			if !changed {
				return nil
			}
			r.LastUpdatedTime = metav1.NewTime(now)
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			changes = append(changes, change{bytes.Clone(k), data})
			refs = append(refs, r.ImageRef)
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, c := range changes {
			if err := putRecord(tx, c.k, c.v, now); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	return refs, nil
}

// RevokeImage removes every credential of imageRef's record but keeps the
// record, and forgets its preloaded names: every pod must verify again. It
// reports whether there was a record (one that does not decode is left: it
// already means "verify").
func (s *Store) RevokeImage(imageRef string, now time.Time) (bool, error) {
	found := false
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		r := d.takeOut(tx, []byte(imageRef))
		if r == nil {
			return []string{imageRef}, nil
		}
		found = true
		for repo := range r.CredentialMapping {
			r.CredentialMapping[repo] = kubeletconfigv1beta1.ImagePullCredentials{}
		}
		d.replace(nil, r)
		r.LastUpdatedTime = metav1.NewTime(now)
		if err := storeRecord(tx, r, now); err != nil {
			return nil, err
		}
		return []string{imageRef}, delPreloaded(tx, []byte(imageRef))
	})
	if err == nil {
		s.preloaded.set(imageRef, nil)
	}
	return found, err
}

// RevokeServiceAccount removes the service account namespace/name from
// every record and returns the image IDs of the records it changed.
func (s *Store) RevokeServiceAccount(namespace, name string, now time.Time) ([]string, error) {
	return s.update(now, func(r *Record) bool {
		changed := false
		for repo, c := range r.CredentialMapping {
			kept := slices.DeleteFunc(slices.Clone(c.KubernetesServiceAccounts), func(sa ServiceAccount) bool {
				return sa.Namespace == namespace && sa.Name == name
			})
			if len(kept) != len(c.KubernetesServiceAccounts) {
				c.KubernetesServiceAccounts = kept
				r.CredentialMapping[repo] = c
				changed = true
			}
		}
		return changed
	})
}

// List returns every record that decodes, and the keys of those that do not.
func (s *Store) List() ([]*Record, []string, error) {
	var out []*Record
	var bad []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return recordsBucket(tx).ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil {
				bad = append(bad, string(k))
				return nil
			}
			out = append(out, r)
			return nil
		})
	})
	return out, bad, err
}

// Counts returns the number of records and intents on disk, from counters
// kept with every write: cheap enough for every metrics scrape.
func (s *Store) Counts() (records, intents int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		records, intents = count(tx, keyRecordsCount), count(tx, keyIntentsCount)
		return nil
	})
	return records, intents, err
}

// PutRecords stores whole records, replacing those with the same image
// ID, in one transaction (imports, tests, benchmarks).
func (s *Store) PutRecords(recs []*Record) error { return s.PutRecordsPreloaded(recs, nil) }

// PutRecordsPreloaded is PutRecords, and merges pre into the preloaded
// records in the same transaction: the names of each are added to its
// image's, only beside a record of the image (the database's or one of
// recs).
func (s *Store) PutRecordsPreloaded(recs []*Record, pre []*PreloadedRecord) error {
	for _, r := range recs {
		if err := validImageRef(r.ImageRef); err != nil {
			return err
		}
	}
	var changed map[string][]string
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		for _, r := range recs {
			d.takeOut(tx, []byte(r.ImageRef))
			d.replace(nil, r)
			if err := storeRecord(tx, r, r.LastUpdatedTime.Time); err != nil {
				return nil, err
			}
		}
		var err error
		changed, err = putPreloaded(tx, pre)
		return nil, err
	})
	if err != nil {
		return err
	}
	for ref, names := range changed {
		s.preloaded.set(ref, names)
	}
	return nil
}

// Prune deletes the records of images for which present returns false and
// that were last updated before until; it returns how many it deleted. It
// reads the updated index, not the records: a run costs a few bytes per
// record, not the whole file in memory.
func (s *Store) Prune(present func(imageRef string) bool, until time.Time) (int, error) {
	n := 0
	var pruned [][]byte
	err := s.write(func(tx *bolt.Tx, d repoDelta) ([]string, error) {
		var doomed [][]byte
		err := updatedBucket(tx).ForEach(func(k, v []byte) error {
			if ref := imageRefOf(k); !present(ref) && decodeTime(v).Before(until) {
				doomed = append(doomed, []byte(ref))
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, k := range doomed {
			if err := delVouched(tx, k, d.takeOut(tx, k)); err != nil {
				return nil, err
			}
			if _, err := delRecord(tx, k); err != nil {
				return nil, err
			}
		}
		n = len(doomed)
		pruned = doomed
		return nil, nil
	})
	if err == nil {
		for _, k := range pruned {
			s.preloaded.set(string(k), nil)
		}
	}
	return n, err
}
