package records

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestOnlyAnAbsentFileBecomesANewDatabase: a file that exists but is not a
// whole ensure database (emptied, truncated, garbage, another bbolt file)
// is an error naming it, read-write and read-only, and is left as it was:
// made into a new database it would have a new salt and no records, and
// every image pulled with credentials would pass for a preloaded one.
func TestOnlyAnAbsentFileBecomesANewDatabase(t *testing.T) {
	t.Parallel()
	// A database of several pages, its bytes kept to cut from.
	whole := filepath.Join(t.TempDir(), "ensure.db")
	s, err := Open(whole, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hash := s.HashAuth(Auth{Username: "alice", Password: "a"})
	for i := range 300 {
		if err := s.RecordPull(fmt.Sprintf("sha256:%064x", i), "r.test/app", Credential{Hash: hash}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	data, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	// bbolt grows the file ahead of its pages: used is where they end.
	var used int64
	if db, err := bolt.Open(whole, 0o600, &bolt.Options{ReadOnly: true}); err != nil {
		t.Fatal(err)
	} else {
		db.View(func(tx *bolt.Tx) error { used = tx.Size(); return nil })
		db.Close()
	}
	if used < 8*4096 || used > int64(len(data)) {
		t.Fatalf("the database's pages take %d bytes of %d: too few to truncate meaningfully", used, len(data))
	}
	foreign := filepath.Join(t.TempDir(), "foreign.db")
	if db, err := bolt.Open(foreign, 0o600, nil); err != nil {
		t.Fatal(err)
	} else {
		db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
		db.Close()
	}
	foreignData, err := os.ReadFile(foreign)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"an empty file", nil},
		{"a file cut inside its first page", data[:100]},
		{"a file cut after its meta pages", data[:2*4096]},
		{"a file cut in half", data[:len(data)/2]},
		{"a file without its last page", data[:used-4096]},
		{"garbage", bytes.Repeat([]byte("this is not a records database\n"), 2000)},
		{"a bbolt file of something else", foreignData},
	} {
		for _, ro := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s is refused, read-only %v, and left as it was", tc.name, ro), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "ensure.db")
				if err := os.WriteFile(path, tc.content, 0o600); err != nil {
					t.Fatal(err)
				}
				s, err := Open(path, Options{ReadOnly: ro})
				if err == nil {
					s.Close()
					t.Fatalf("opened as a database")
				}
				t.Log(err)
				if !strings.Contains(err.Error(), path) {
					t.Errorf("the error does not name the file: %v", err)
				}
				if after, _ := os.ReadFile(path); !bytes.Equal(after, tc.content) {
					t.Errorf("the file was changed: %d bytes, was %d", len(after), len(tc.content))
				}
			})
		}
	}

	t.Run("an absent file is created, read-write only", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ensure.db")
		if s, err := Open(path, Options{ReadOnly: true}); err == nil {
			s.Close()
			t.Fatal("a read-only open created the file")
		}
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err = Open(path, Options{}); err != nil {
			t.Fatalf("the new database does not open again: %v", err)
		}
		s.Close()
		if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(left) != 1 {
			t.Errorf("files left beside the database: %v", left)
		}
	})

	t.Run("the whole file still opens, its records there", func(t *testing.T) {
		s, err := Open(whole, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if n, _, err := s.Counts(); err != nil || n != 300 {
			t.Errorf("%d records, %v", n, err)
		}
	})
}
