package records

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCrashHelper is the child of TestCrashKeepsAcknowledgedWrites: it
// writes records and intents as fast as it can and prints each one it has
// committed, until it is killed.
func TestCrashHelper(t *testing.T) {
	path := os.Getenv("ENSURE_CRASH_DB")
	if path == "" {
		t.Skip("run by TestCrashKeepsAcknowledgedWrites")
	}
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	for i := 0; ; i++ {
		ref := fmt.Sprintf("sha256:%064x", i)
		intent, err := s.AddIntent(fmt.Sprintf("r.test/app:%d", i))
		if err != nil {
			fmt.Println("intent:", err)
			os.Exit(3)
		}
		if err := s.RecordPull(ref, "r.test/app", Credential{Hash: fmt.Sprintf("sha256:%d", i)}, intent, time.Now(), nil); err != nil {
			fmt.Println("record:", err)
			os.Exit(3)
		}
		fmt.Println("ack", ref) // committed: the answer a CRI client would get now
	}
}

// TestCrashKeepsAcknowledgedWrites kills a writer with SIGKILL in the
// middle of its writes, several times, and checks after each crash that
// the file opens and holds every write the writer had acknowledged.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	path := filepath.Join(t.TempDir(), "ensure.db")
	acked := map[string]bool{}
	for round, after := range []int{1, 7, 40, 3, 120} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.v=false")
		cmd.Env = append(os.Environ(), "ENSURE_CRASH_DB="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			line := sc.Text()
			ref, ok := strings.CutPrefix(line, "ack ")
			if !ok {
				t.Fatalf("round %d: child said %q", round, line)
			}
			acked[ref] = true
			if n++; n == after {
				cmd.Process.Signal(syscall.SIGKILL) // in the middle of the next write
				break
			}
		}
		// Acks already written before the kill count too.
		for sc.Scan() {
			if ref, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
				acked[ref] = true
			}
		}
		cmd.Wait()

		s, err := Open(path, Options{})
		if err != nil {
			t.Fatalf("round %d: the file does not open after a crash: %v", round, err)
		}
		records, bad, err := s.List()
		if err != nil || len(bad) > 0 {
			t.Fatalf("round %d: list: %v, undecodable %v", round, err, bad)
		}
		have := map[string]bool{}
		for _, r := range records {
			have[r.ImageRef] = true
		}
		for ref := range acked {
			if !have[ref] {
				t.Fatalf("round %d: acknowledged record %s is lost", round, ref)
			}
		}
		s.Close()
		t.Logf("round %d: killed after %d acknowledged writes; %d records, all %d acknowledged present", round, after, len(records), len(acked))
	}
}
