package main

import (
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
