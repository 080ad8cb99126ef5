package records

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// snapshot is what a probe must not change: every key and value of the
// schema bucket, and the root's buckets.
func snapshot(t *testing.T, s *Store) (schema map[string]string, roots []string, txid int) {
	t.Helper()
	schema = map[string]string{}
	err := s.db.View(func(tx *bolt.Tx) error {
		txid = tx.ID()
		if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			roots = append(roots, string(name))
			return nil
		}); err != nil {
			return err
		}
		var walk func(prefix string, b *bolt.Bucket) error
		walk = func(prefix string, b *bolt.Bucket) error {
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					return walk(prefix+string(k)+"/", b.Bucket(k))
				}
				schema[prefix+string(k)] = string(v)
				return nil
			})
		}
		return walk("", tx.Bucket(bucketSchema))
	})
	if err != nil {
		t.Fatal(err)
	}
	return schema, roots, txid
}

// check runs bbolt's consistency check of the whole file.
func check(t *testing.T, s *Store) {
	t.Helper()
	if err := s.db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}); err != nil {
		t.Fatalf("the file is not consistent: %v", err)
	}
}

func TestProbeWrite(t *testing.T) {
	t.Parallel()

	t.Run("it commits three times and changes no record, intent or counter", func(t *testing.T) {
		s, err := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.RecordPull(refA, "r.test/app", Credential{Hash: s.HashAuth(Auth{Username: "a", Password: "b"})}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddIntent("r.test/app:v2"); err != nil {
			t.Fatal(err)
		}
		before, roots, txid := snapshot(t, s)
		if err := s.ProbeWrite(); err != nil {
			t.Fatal(err)
		}
		after, rootsAfter, txidAfter := snapshot(t, s)
		if !maps.Equal(before, after) || !slices.Equal(roots, rootsAfter) {
			t.Errorf("the probe changed the database: schema %d keys -> %d, root buckets %q -> %q", len(before), len(after), roots, rootsAfter)
		}
		if txidAfter != txid+3 {
			t.Errorf("transaction %d after the probe, want %d: three commits", txidAfter, txid+3)
		}
		check(t, s)
	})

	t.Run("its large value takes new pages of the file when the free ones cannot hold it", func(t *testing.T) {
		s, err := Open(filepath.Join(t.TempDir(), "ensure.db"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		size := func() (n int64) {
			s.db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
			return n
		}
		before, free := size(), s.db.Stats().FreePageN
		if free >= probePages {
			t.Fatalf("a new database has %d free pages: the test needs fewer than %d", free, probePages)
		}
		if err := s.ProbeWrite(); err != nil {
			t.Fatal(err)
		}
		if grown := size() - before; grown < int64(probePages*s.db.Info().PageSize) {
			t.Errorf("the database's pages grew by %d bytes, want at least %d: the probe did not need new space", grown, probePages*s.db.Info().PageSize)
		}
	})

	t.Run("it fails where a record write fails, leaves the file whole, and succeeds once the file may grow", func(t *testing.T) {
		if testing.Short() {
			t.Skip("runs a child process")
		}
		path := filepath.Join(t.TempDir(), "ensure.db")
		s, err := Open(path, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RecordPull(refA, "r.test/app", Credential{Hash: "sha256:0"}, "", t0, nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
		cmd := exec.Command(os.Args[0], "-test.run=^TestProbeWriteHelper$", "-test.v=false")
		cmd.Env = append(os.Environ(), "ENSURE_PROBE_DB="+path)
		out, err := cmd.CombinedOutput()
		said := map[string]string{}
		acked := []string{refA}
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), " ")
			if k == "ack" {
				acked = append(acked, v)
			} else {
				said[k] = v
			}
		}
		if err != nil || said["done"] == "" {
			t.Fatalf("the child: %v\n%s", err, out)
		}
		if !strings.Contains(said["record-failed"], "file too large") || !strings.Contains(said["probe-failed"], "file too large") {
			t.Errorf("record write failed with %q, probe with %q; want both refused by the file size limit", said["record-failed"], said["probe-failed"])
		}
		if said["probe-after"] != "ok" || said["record-after"] != "ok" {
			t.Errorf("once the file may grow: probe %q, record %q; want both ok", said["probe-after"], said["record-after"])
		}
		t.Logf("%d records acknowledged before the limit; record write: %s; probe: %s", len(acked)-1, said["record-failed"], said["probe-failed"])

		s, err = Open(path, Options{})
		if err != nil {
			t.Fatalf("the file does not open after the failed probe: %v", err)
		}
		defer s.Close()
		check(t, s)
		recs, bad, err := s.List()
		if err != nil || len(bad) > 0 {
			t.Fatalf("list: %v, undecodable %v", err, bad)
		}
		have := map[string]bool{}
		for _, r := range recs {
			have[r.ImageRef] = true
		}
		for _, ref := range acked {
			if !have[ref] {
				t.Errorf("acknowledged record %s is lost", ref)
			}
		}
		if n, _, _ := s.Counts(); n != len(recs) {
			t.Errorf("the records counter says %d, the bucket holds %d", n, len(recs))
		}
		if _, roots, _ := snapshot(t, s); !slices.Equal(roots, []string{string(bucketSchema)}) {
			t.Errorf("root buckets %q: the probe left its value", roots)
		}
	})
}

// TestProbeWriteHelper is the child of TestProbeWrite: under a file size
// limit at the file's size (a file that cannot grow, as on a full disk,
// though without the holes bbolt leaves), it writes records until one
// fails, probes, lifts the limit, and probes and writes again. It prints
// each record it committed, and each outcome.
func TestProbeWriteHelper(t *testing.T) {
	path := os.Getenv("ENSURE_PROBE_DB")
	if path == "" {
		t.Skip("run by TestProbeWrite")
	}
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	fi, err := os.Stat(path)
	if err != nil {
		fmt.Println("stat:", err)
		os.Exit(3)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fmt.Println("getrlimit:", err)
		os.Exit(3)
	}
	signal.Ignore(syscall.SIGXFSZ) // the write fails with EFBIG instead
	limited := syscall.Rlimit{Cur: uint64(fi.Size()), Max: lim.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limited); err != nil {
		fmt.Println("setrlimit:", err)
		os.Exit(3)
	}
	for i := 1; ; i++ {
		ref := fmt.Sprintf("sha256:%064x", i)
		if err := s.RecordPull(ref, "r.test/app", Credential{Hash: fmt.Sprintf("sha256:%d", i)}, "", t0, nil); err != nil {
			fmt.Println("record-failed", err)
			break
		}
		fmt.Println("ack", ref)
		if i == 100000 {
			fmt.Println("record-failed never")
			break
		}
	}
	if err := s.ProbeWrite(); err != nil {
		fmt.Println("probe-failed", err)
	} else {
		fmt.Println("probe-failed no: it succeeded")
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fmt.Println("setrlimit:", err)
		os.Exit(3)
	}
	outcome := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	fmt.Println("probe-after", outcome(s.ProbeWrite()))
	ref := fmt.Sprintf("sha256:%064x", 0)
	err = s.RecordPull(ref, "r.test/app", Credential{Hash: "sha256:after"}, "", t0, nil)
	fmt.Println("record-after", outcome(err))
	if err == nil {
		fmt.Println("ack", ref)
	}
	if err := s.Close(); err != nil {
		fmt.Println("close:", err)
		os.Exit(3)
	}
	fmt.Println("done yes")
}
