package records

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
)

const refA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestOpen(t *testing.T) {
	t.Parallel()
	alice := Auth{Username: "alice", Password: "a"}

	t.Run("the file is made with mode 0600 in a 0700 directory", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state", "ensure.db")
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fi, _ := os.Stat(path)
		di, _ := os.Stat(filepath.Dir(path))
		if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
			t.Errorf("file %v, dir %v", fi.Mode().Perm(), di.Mode().Perm())
		}
	})

	t.Run("records and the salt survive a reopen", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		s, _ := Open(path, Options{})
		h := s.HashAuth(alice)
		if err := s.RecordPull(refA, "r.test/app", Credential{Hash: h}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.HashAuth(alice) != h {
			t.Errorf("the same credential hashes differently after a reopen")
		}
		r, err := s.Get(refA)
		if err != nil || r.CredentialMapping["r.test/app"].KubernetesSecrets[0].CredentialHash != h {
			t.Errorf("record %+v, %v", r, err)
		}
	})

	t.Run("two databases salt differently: no shared lookup table", func(t *testing.T) {
		a, _ := Open(filepath.Join(t.TempDir(), "a.db"), Options{})
		b, _ := Open(filepath.Join(t.TempDir(), "b.db"), Options{})
		defer a.Close()
		defer b.Close()
		if a.HashAuth(alice) == b.HashAuth(alice) {
			t.Errorf("two databases share a salt")
		}
	})

	t.Run("a second opener fails fast with a clear error", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		s, _ := Open(path, Options{})
		defer s.Close()
		start := time.Now()
		_, err := Open(path, Options{OpenTimeout: 100 * time.Millisecond})
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), path) {
			t.Errorf("got %v", err)
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("waited %v for the lock", time.Since(start))
		}
	})

	t.Run("a file from a newer build is refused, read-only too", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		s, _ := Open(path, Options{})
		s.db.Update(func(tx *bolt.Tx) error {
			return metaBucket(tx).Put(keyVersion, binary.AppendUvarint(nil, uint64(latest(migrations)+1)))
		})
		s.Close()
		for _, ro := range []bool{false, true} {
			if _, err := Open(path, Options{ReadOnly: ro}); !errors.Is(err, errNewerDatabase) || !strings.Contains(err.Error(), path) {
				t.Errorf("read-only %v: got %v", ro, err)
			}
		}
	})

	t.Run("a file that is not a database is an error naming it", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		os.WriteFile(path, []byte("not a bolt file, definitely not"), 0o600)
		if _, err := Open(path, Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("got %v", err)
		}
	})
}

func TestRecordsThatDoNotDecodeAreErrors(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ensure.db")
	s, _ := Open(path, Options{})
	defer s.Close()
	for _, tc := range []struct {
		name, value string
	}{
		{"garbage", "{not json"},
		{"an unknown field", `{"imageRef":"` + refA + `","credentialMapping":{},"extra":1}`},
		{"a record of another image", `{"imageRef":"sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}`},
	} {
		t.Run(tc.name+" is an error, not a missing record", func(t *testing.T) {
			s.db.Update(func(tx *bolt.Tx) error { return recordsBucket(tx).Put([]byte(refA), []byte(tc.value)) })
			_, err := s.Get(refA)
			if err == nil || errors.Is(err, ErrNotFound) {
				t.Errorf("got %v", err)
			}
		})
	}
	t.Run("a new pull replaces an undecodable record", func(t *testing.T) {
		if err := s.RecordPull(refA, "r.test/app", Credential{Node: true}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(refA); err != nil {
			t.Errorf("got %v", err)
		}
	})
}

// migrationTests has one case per migration: a database as the version
// before it wrote it (init), and what must hold after (check).
var migrationTests = []struct {
	name  string
	init  func(*bolt.Tx) error
	check func(*bolt.Tx) error
}{
	{
		name: "version 2 indexes each record's update time, an undecodable record as old",
		init: func(tx *bolt.Tx) error {
			r := &Record{ImageRef: "sha256:" + strings.Repeat("a", 64), LastUpdatedTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			// Version 1 wrote records without the index.
			if err := recordsBucket(tx).Put([]byte(r.ImageRef), data); err != nil {
				return err
			}
			return recordsBucket(tx).Put([]byte("sha256:"+strings.Repeat("b", 64)), []byte("{garbage"))
		},
		check: func(tx *bolt.Tx) error {
			ub := updatedBucket(tx)
			if got := decodeTime(ub.Get(indexKey([]byte("sha256:" + strings.Repeat("a", 64))))); !got.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
				return fmt.Errorf("the record's update time is indexed as %v", got)
			}
			if v := ub.Get(indexKey([]byte("sha256:" + strings.Repeat("b", 64)))); v == nil || !decodeTime(v).IsZero() {
				return fmt.Errorf("the undecodable record is indexed as %v (present: %v)", decodeTime(v), v != nil)
			}
			return nil
		},
	},
	{
		name: "version 3 adds an empty bucket of verification times: credentials verified before have none",
		init: func(tx *bolt.Tx) error {
			if err := tx.Bucket(bucketSchema).DeleteBucket(bucketVerified); err != nil {
				return err
			}
			r := &Record{ImageRef: "sha256:" + strings.Repeat("c", 64), LastUpdatedTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			return putRecord(tx, []byte(r.ImageRef), data, r.LastUpdatedTime.Time)
		},
		check: func(tx *bolt.Tx) error {
			vb := verifiedBucket(tx)
			if vb == nil {
				return fmt.Errorf("no verified bucket")
			}
			if k, _ := vb.Cursor().First(); k != nil {
				return fmt.Errorf("the verified bucket is not empty: %q", k)
			}
			if recordsBucket(tx).Get([]byte("sha256:"+strings.Repeat("c", 64))) == nil {
				return fmt.Errorf("the record is gone")
			}
			return nil
		},
	},
	{
		name: "version 4 adds empty buckets of images' layers and of repositories' words for them: the daemon learns the layers from the runtime",
		init: func(tx *bolt.Tx) error {
			for _, b := range [][]byte{bucketLayers, bucketVouched} {
				if err := tx.Bucket(bucketSchema).DeleteBucket(b); err != nil {
					return err
				}
			}
			r := &Record{ImageRef: "sha256:" + strings.Repeat("d", 64), LastUpdatedTime: metav1.NewTime(t0)}
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			return putRecord(tx, []byte(r.ImageRef), data, t0)
		},
		check: func(tx *bolt.Tx) error {
			for _, b := range []*bolt.Bucket{layersBucket(tx), vouchedBucket(tx)} {
				if b == nil {
					return fmt.Errorf("a bucket is missing")
				}
				if k, _ := b.Cursor().First(); k != nil {
					return fmt.Errorf("a new bucket is not empty: %q", k)
				}
			}
			if recordsBucket(tx).Get([]byte("sha256:"+strings.Repeat("d", 64))) == nil {
				return fmt.Errorf("the record is gone")
			}
			return nil
		},
	},
	{
		name: "version 5 adds an empty bucket of preloaded names: an image recorded before has none, its record untouched",
		init: func(tx *bolt.Tx) error {
			if err := tx.Bucket(bucketSchema).DeleteBucket(bucketPreloaded); err != nil {
				return err
			}
			r := &Record{ImageRef: "sha256:" + strings.Repeat("e", 64), LastUpdatedTime: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
				CredentialMapping: map[string]kubeletconfigv1beta1.ImagePullCredentials{"r.test/team/base": {KubernetesSecrets: []kubeletconfigv1beta1.ImagePullSecret{{CredentialHash: "h"}}}}}
			data, err := encodeRecord(r)
			if err != nil {
				return err
			}
			return putRecord(tx, []byte(r.ImageRef), data, r.LastUpdatedTime.Time)
		},
		check: func(tx *bolt.Tx) error {
			pb := preloadedBucket(tx)
			if pb == nil {
				return fmt.Errorf("no preloaded bucket")
			}
			if k, _ := pb.Cursor().First(); k != nil {
				return fmt.Errorf("the preloaded bucket is not empty: %q", k)
			}
			r, err := decodeRecord([]byte("sha256:"+strings.Repeat("e", 64)), recordsBucket(tx).Get([]byte("sha256:"+strings.Repeat("e", 64))))
			if err != nil || len(r.CredentialMapping["r.test/team/base"].KubernetesSecrets) != 1 {
				return fmt.Errorf("the record changed: %+v, %v", r, err)
			}
			return nil
		},
	},
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	if len(migrationTests) != len(migrations) {
		t.Fatal("each migration must have a test case")
	}
	for i, mt := range migrationTests {
		t.Run(mt.name, func(t *testing.T) {
			db := rawDB(t)
			if err := db.Update(func(tx *bolt.Tx) error {
				if err := initialize(tx, migrations[:i], newSalt); err != nil {
					return err
				}
				return mt.init(tx)
			}); err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error { return initialize(tx, migrations, newSalt) }); err != nil {
				t.Fatal(err)
			}
			if err := db.View(mt.check); err != nil {
				t.Fatal(err)
			}
		})
	}

	// The mechanism itself, with migrations made up for the test.
	var ran []int
	step := func(v int, fail bool) migration {
		return migration{version: v, migrate: func(tx *bolt.Tx) error {
			ran = append(ran, v)
			if fail {
				return errors.New("broken migration")
			}
			return recordsBucket(tx).Put([]byte("migrated-to"), []byte{byte(v)})
		}}
	}
	version := func(db *bolt.DB) int {
		v := 0
		db.View(func(tx *bolt.Tx) error {
			n, _ := binary.Uvarint(metaBucket(tx).Get(keyVersion))
			v = int(n)
			return nil
		})
		return v
	}

	t.Run("a new file starts at the latest version and runs no migration", func(t *testing.T) {
		ran = nil
		db := rawDB(t)
		db.Update(func(tx *bolt.Tx) error { return initialize(tx, []migration{step(2, false), step(3, false)}, newSalt) })
		if version(db) != 3 || len(ran) != 0 {
			t.Errorf("version %d, ran %v", version(db), ran)
		}
	})
	t.Run("an older file runs the missing migrations in order", func(t *testing.T) {
		ran = nil
		db := rawDB(t)
		db.Update(func(tx *bolt.Tx) error { return initialize(tx, []migration{step(2, false)}, newSalt) })
		if err := db.Update(func(tx *bolt.Tx) error {
			return initialize(tx, []migration{step(2, false), step(3, false), step(4, false)}, newSalt)
		}); err != nil {
			t.Fatal(err)
		}
		if version(db) != 4 || len(ran) != 2 || ran[0] != 3 || ran[1] != 4 {
			t.Errorf("version %d, ran %v", version(db), ran)
		}
	})
	t.Run("a failed migration changes nothing", func(t *testing.T) {
		ran = nil
		db := rawDB(t)
		db.Update(func(tx *bolt.Tx) error { return initialize(tx, []migration{step(2, false)}, newSalt) })
		err := db.Update(func(tx *bolt.Tx) error {
			return initialize(tx, []migration{step(2, false), step(3, false), step(4, true)}, newSalt)
		})
		if err == nil || !strings.Contains(err.Error(), "migration to version 4") {
			t.Fatalf("got %v", err)
		}
		var migrated []byte
		db.View(func(tx *bolt.Tx) error { migrated = recordsBucket(tx).Get([]byte("migrated-to")); return nil })
		if version(db) != 2 || migrated != nil {
			t.Errorf("a failed migration left version %d and %v", version(db), migrated)
		}
	})
	t.Run("a file from a newer build is refused, untouched", func(t *testing.T) {
		db := rawDB(t)
		db.Update(func(tx *bolt.Tx) error { return initialize(tx, []migration{step(2, false), step(7, false)}, newSalt) })
		err := db.Update(func(tx *bolt.Tx) error { return initialize(tx, []migration{step(2, false)}, newSalt) })
		if !errors.Is(err, errNewerDatabase) || version(db) != 7 {
			t.Errorf("got %v, version %d", err, version(db))
		}
	})
}

func rawDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "raw.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// FuzzDecodeRecord: a stored value never panics the decoder; what decodes
// belongs to its key and encodes back to a record that decodes the same.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(refA), []byte(`{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-11-22T00:00:00Z","imageRef":"`+refA+`","credentialMapping":{"r.test/app":{"kubernetesSecrets":[{"uid":"","namespace":"","name":"","credentialHash":"sha256:00"}],"nodePodsAccessible":true}}}`))
	f.Add([]byte(refA), []byte(`{"imageRef":"x"}`))
	f.Add([]byte("k"), []byte(`[]`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		r, err := decodeRecord(key, value)
		if err != nil {
			return
		}
		if r.ImageRef != string(key) {
			t.Fatalf("decoded a record of %q under %q", r.ImageRef, key)
		}
		data, err := encodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeRecord(key, data); err != nil {
			t.Fatalf("a re-encoded record does not decode: %v", err)
		}
	})
}

func TestCountsMatchTheBuckets(t *testing.T) {
	t.Parallel()
	s, _ := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
	defer s.Close()
	var intents []string
	for i := 0; i < 30; i++ {
		id, _ := s.AddIntent("r.test/app")
		intents = append(intents, id)
		ref := fmt.Sprintf("sha256:%064x", i)
		if err := s.RecordPull(ref, "r.test/app", Credential{Node: true}, intents[i], t0, nil); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			s.Forget(ref)
		}
		if i%5 == 0 {
			s.AddIntent("r.test/other") // left in flight
		}
	}
	s.DropIntent("no-such-intent")
	s.Forget("sha256:none")
	s.Prune(func(string) bool { return false }, t0.Add(-time.Hour)) // prunes nothing: too recent
	records, in, _ := s.Counts()
	s.db.View(func(tx *bolt.Tx) error {
		if n := recordsBucket(tx).Stats().KeyN; n != records {
			t.Errorf("records counter %d, bucket holds %d", records, n)
		}
		if n := intentsBucket(tx).Stats().KeyN; n != in {
			t.Errorf("intents counter %d, bucket holds %d", in, n)
		}
		return nil
	})
	if records != 20 || in != 6 {
		t.Errorf("counts %d records, %d intents; want 20, 6", records, in)
	}
}

func TestIndexKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ref string
		size      int
	}{
		{"a sha256 image ID takes 33 bytes", "sha256:" + strings.Repeat("0f", 32), 33},
		{"another algorithm is kept as text", "sha512:" + strings.Repeat("ab", 64), 1 + 7 + 128},
		{"upper-case hex is kept as text, so that it comes back unchanged", "sha256:" + strings.Repeat("AB", 32), 1 + 71},
		{"a short sha256 is kept as text", "sha256:abc", 1 + 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := indexKey([]byte(tc.ref))
			if len(k) != tc.size || imageRefOf(k) != tc.ref {
				t.Errorf("key of %d bytes gives back %q", len(k), imageRefOf(k))
			}
		})
	}
}

func TestTheUpdatedIndexFollowsTheRecords(t *testing.T) {
	t.Parallel()
	s, _ := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
	defer s.Close()
	ref := func(i int) string { return fmt.Sprintf("sha256:%064x", i) }
	for i := range 12 {
		if err := s.RecordPull(ref(i), "r.test/app", Credential{Hash: "h"}, "", t0.Add(time.Duration(i)*time.Hour), nil); err != nil {
			t.Fatal(err)
		}
	}
	s.Forget(ref(0))
	s.RevokeImage(ref(1), t0.Add(100*time.Hour)) // now recent
	// Absent and older than t0+6h: 2..5 go; 1 was just updated; 6..11 are recent.
	n, err := s.Prune(func(r string) bool { return r == ref(3) }, t0.Add(6*time.Hour))
	if err != nil || n != 3 {
		t.Fatalf("pruned %d (%v), want 3", n, err)
	}
	s.db.View(func(tx *bolt.Tx) error {
		var records, index []string
		recordsBucket(tx).ForEach(func(k, _ []byte) error { records = append(records, string(k)); return nil })
		updatedBucket(tx).ForEach(func(k, _ []byte) error { index = append(index, imageRefOf(k)); return nil })
		if !slices.Equal(records, index) {
			t.Errorf("records %v, index %v", records, index)
		}
		if got := decodeTime(updatedBucket(tx).Get(indexKey([]byte(ref(1))))); !got.Equal(t0.Add(100 * time.Hour)) {
			t.Errorf("the revoked record's update time is indexed as %v", got)
		}
		return nil
	})
	for _, gone := range []int{0, 2, 4, 5} {
		if _, err := s.Get(ref(gone)); !errors.Is(err, ErrNotFound) {
			t.Errorf("record %d: %v, want gone", gone, err)
		}
	}
	for _, kept := range []int{1, 3, 6, 11} {
		if _, err := s.Get(ref(kept)); err != nil {
			t.Errorf("record %d: %v, want kept", kept, err)
		}
	}
}

func FuzzIndexKeyRoundTrip(f *testing.F) {
	f.Add("sha256:" + strings.Repeat("0f", 32))
	f.Add("sha256:" + strings.Repeat("AB", 32))
	f.Add("")
	f.Fuzz(func(t *testing.T, ref string) {
		if got := imageRefOf(indexKey([]byte(ref))); got != ref {
			t.Errorf("%q comes back as %q", ref, got)
		}
	})
}
