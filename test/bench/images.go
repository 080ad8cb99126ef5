package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// importImages loads n distinct small images into containerd's k8s.io
// namespace with ctr: one shared layer, a config of their own each, so that
// CRI lists n images.
func importImages(dir, containerdSock string, n int) error {
	l, err := random.Layer(512, "application/vnd.docker.image.rootfs.diff.tar.gzip")
	if err != nil {
		return err
	}
	base, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	refs := make(map[name.Reference]v1.Image, n)
	for i := 0; i < n; i++ {
		cf, err := base.ConfigFile()
		if err != nil {
			return err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", "amd64"
		cf.Config.Env = []string{fmt.Sprintf("BENCH_IMAGE=%d", i)}
		img, err := mutate.ConfigFile(base, cf)
		if err != nil {
			return err
		}
		tag, err := name.NewTag(fmt.Sprintf("bench.invalid/many/image-%04d:v1", i))
		if err != nil {
			return err
		}
		refs[tag] = img
	}
	archive := filepath.Join(dir, "many-images.tar")
	if err := tarball.MultiRefWriteToFile(archive, refs); err != nil {
		return err
	}
	defer os.Remove(archive)
	out, err := exec.Command("ctr", "--address", containerdSock, "-n", "k8s.io", "images", "import", "--no-unpack", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import: %v: %s", err, tail(string(out), 5))
	}
	return nil
}
