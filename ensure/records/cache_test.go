package records

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestAReadThatRacedAWriteIsNotCached widens the window between a cache
// miss's read and its store into the cache, and commits a revoke in it:
// the record read before the revoke must not be served after it.
func TestAReadThatRacedAWriteIsNotCached(t *testing.T) {
	t.Parallel()
	const repo = "r.test/app"
	s, err := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hash := s.HashAuth(Auth{Username: "alice", Password: "a"})
	if err := s.RecordPull(refA, repo, Credential{Hash: hash}, "", t0, nil); err != nil {
		t.Fatal(err)
	}

	// The reader stops in the window; a writer on another goroutine
	// revokes the image meanwhile; then the reader goes on.
	read, written := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.afterRead = func() {
		once.Do(func() {
			close(read)
			<-written
		})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-read
		if _, err := s.RevokeImage(refA, t0); err != nil {
			t.Error(err)
		}
		close(written)
	}()
	if _, err := s.Get(refA); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s.afterRead = nil

	r, err := s.Get(refA)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.CredentialMapping[repo]; len(c.KubernetesSecrets) != 0 {
		t.Errorf("after the revoke the store still serves the revoked credential: %+v", c.KubernetesSecrets)
	}
}

// TestTheCacheAgreesWithTheFileUnderConcurrentReadsAndWrites runs readers
// against a writer that grants and revokes in turn (under -race in `make
// test`), each read yielding in the window; once all stop, what Get serves
// is what the file holds.
func TestTheCacheAgreesWithTheFileUnderConcurrentReadsAndWrites(t *testing.T) {
	t.Parallel()
	const repo, writes, readers = "r.test/app", 100, 4
	s, err := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hash := s.HashAuth(Auth{Username: "alice", Password: "a"})
	s.afterRead = runtime.Gosched
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
					s.Get(refA)
				}
			}
		}()
	}
	for i := range writes {
		var err error
		if i%2 == 0 {
			err = s.RecordPull(refA, repo, Credential{Hash: hash}, "", t0, nil)
		} else {
			_, err = s.RevokeImage(refA, t0)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()

	served, err := s.Get(refA)
	if err != nil {
		t.Fatal(err)
	}
	var onDisk *Record
	if err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		onDisk, err = decodeRecord([]byte(refA), recordsBucket(tx).Get([]byte(refA)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := len(served.CredentialMapping[repo].KubernetesSecrets), len(onDisk.CredentialMapping[repo].KubernetesSecrets); got != want {
		t.Errorf("Get serves %d secret(s) for %s, the file holds %d", got, repo, want)
	}
}
