package e2e

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelease runs make release and checks what an operator downloads:
// a static binary per command and platform, for the right machine, with
// sums that verify, and a version that names the commit.
func TestRelease(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command("make", "-C", "../..", "release", "RELEASE_DIR="+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	commands := []string{"cri-image-proxy", "docker-config-credential-provider", "sigstore-image-policy"}
	for _, cmd := range commands {
		for arch, machine := range machines {
			path := filepath.Join(dir, cmd+"-linux-"+arch)
			f, err := elf.Open(path)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				continue
			}
			if f.Machine != machine {
				t.Errorf("%s is for %v, want %v", path, f.Machine, machine)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s is dynamically linked (it has an interpreter)", path)
				}
			}
			f.Close()
		}
	}
	sums := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	sums.Dir = dir
	if out, err := sums.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != 2*len(commands) {
		t.Errorf("sha256sum --check: %v\n%s", err, out)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	version, err := exec.Command(filepath.Join(dir, "cri-image-proxy-linux-amd64"), "version").CombinedOutput()
	if err != nil || !strings.Contains(string(version), "commit "+strings.TrimSpace(string(head))) {
		t.Errorf("the release binary's version does not name the commit %s: %v\n%s", head, err, version)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2*len(commands)+1 {
		t.Errorf("%d files in the release, want %d binaries and SHA256SUMS", len(entries), 2*len(commands))
	}
}
