package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/kubeletrecords"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// TestImportRefusesWhatItCannotPlace: a kubelet record that names no
// repository needs the runtime's names of its image; without the runtime
// the import stops, writes nothing and says what to do.
func TestImportRefusesWhatItCannotPlace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pulled := filepath.Join(dir, "image_manager", kubeletrecords.PulledDir)
	if err := os.MkdirAll(pulled, 0o700); err != nil {
		t.Fatal(err)
	}
	ref := "sha256:" + strings.Repeat("3", 64)
	settled := `{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1beta1","lastUpdatedTime":"2026-11-20T10:00:00Z","imageRef":"` + ref + `"}`
	if err := os.WriteFile(filepath.Join(pulled, kubeletrecords.FileName(ref)), []byte(settled), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "ensure.db")
	s, err := records.Open(db, records.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	out, err := runCLI(t, "records", "import", "--format", "kubelet", filepath.Join(dir, "image_manager"), "--database", db,
		"--admin-socket", filepath.Join(dir, "no-daemon.sock"), "--runtime-endpoint", "unix://"+filepath.Join(dir, "no-runtime.sock"))
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "nothing imported") || !strings.Contains(err.Error(), "no-runtime.sock") {
		t.Errorf("import without the runtime: %v\n%s", err, out)
	}
	s, err = records.Open(db, records.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, i, _ := s.Counts(); n != 0 || i != 0 {
		t.Errorf("%d record(s) and %d intent(s) imported", n, i)
	}
}

// TestRestoreRefusesWhatItCannotDoSafely: with the daemon answering, or
// without the runtime, or a preloaded image that is not on the node,
// records restore changes nothing and says why.
func TestRestoreRefusesWhatItCannotDoSafely(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, backup := filepath.Join(dir, "ensure.db"), filepath.Join(dir, "backup.db")
	for _, p := range []string{db, backup} {
		s, err := records.Open(p, records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	before, _ := os.ReadFile(db)
	daemon := filepath.Join(dir, "admin.sock")
	l, err := net.Listen("unix", daemon)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	noRuntime := "unix://" + filepath.Join(dir, "no-runtime.sock")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"the daemon answers", []string{"--admin-socket", daemon}, "stop it (systemctl stop cri-image-proxy)"},
		{"the runtime cannot be asked", []string{"--admin-socket", filepath.Join(dir, "none.sock")}, "no-runtime.sock"},
		{"a preloaded list that cannot be read", []string{"--admin-socket", filepath.Join(dir, "none.sock"), "--preloaded-from", filepath.Join(dir, "none.txt")}, "--preloaded-from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCLI(t, append([]string{"records", "restore", backup, "--database", db, "--runtime-endpoint", noRuntime}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nothing restored") {
				t.Errorf("got %v, want an error saying %q and nothing restored\n%s", err, tc.want, out)
			}
			if after, _ := os.ReadFile(db); !bytes.Equal(after, before) {
				t.Errorf("the database changed")
			}
		})
	}
}
