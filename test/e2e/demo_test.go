package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemo runs the demo the README's first command runs, on this leg's
// runtime, with the binaries under test: it must go through every step and
// exit 0, so the README stays true as the product grows.
func TestDemo(t *testing.T) {
	needRig(t)
	bin := t.TempDir()
	for _, b := range []string{proxyBin, pluginBin} {
		if err := os.Symlink(b, filepath.Join(bin, filepath.Base(b))); err != nil {
			t.Fatal(err)
		}
	}
	demo := filepath.Join(bin, "demo")
	if out, err := exec.Command("go", "build", "-o", demo, "../../hack/demo").CombinedOutput(); err != nil {
		t.Fatalf("build the demo: %v\n%s", err, out)
	}
	out, err := exec.Command(demo, "-bin-dir", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("the demo failed: %v\n%s", err, tail(string(out), 40))
	}
	for _, want := range []string{
		"tenant B has no credentials",
		"the node's credential plugin supplies them",
		"hello from a container started through cri-image-proxy",
		"stopping the proxy, " + testRig.Runtime.Name + " and the registry",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, tail(string(out), 40))
		}
	}
}
