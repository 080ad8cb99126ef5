package rig

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// file is one entry of a test image layer.
type file struct {
	name string
	mode int64
	data []byte
	link string // hard link target, when set
	dir  bool
}

// layer builds a deterministic layer: fixed times and owners, sorted
// names, so that digests are the same on every run and machine.
func layer(files []file) (v1.Layer, error) {
	sort.SliceStable(files, func(i, j int) bool {
		// Directories and link targets first, so hard links resolve.
		if (files[i].link == "") != (files[j].link == "") {
			return files[i].link == ""
		}
		return files[i].name < files[j].name
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeLink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}

// image is a linux/amd64 image of the given layers and config.
func image(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	return mutate.ConfigFile(img, cf)
}

// busyboxLayer is Debian's static busybox with every applet as a hard link
// (as in the upstream image: a symlinked /bin/ls masked by critest would
// mask busybox itself) and the users critest expects.
func busyboxLayer() (v1.Layer, error) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox (Debian busybox-static): %w", err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	files := []file{
		{name: "bin", dir: true, mode: 0o755}, {name: "etc", dir: true, mode: 0o755}, {name: "tmp", dir: true, mode: 0o1777},
		{name: "bin/busybox", mode: 0o755, data: bb},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nwww-data:x:33:\nusers:x:100:\nnogroup:x:65534:\n")},
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			files = append(files, file{name: "bin/" + a, mode: 0o755, link: "bin/busybox"})
		}
	}
	return layer(files)
}

// pauseBinary builds a static pause program once into toolsDir.
func pauseBinary(toolsDir string) ([]byte, error) {
	bin := filepath.Join(toolsDir, "pause")
	if b, err := os.ReadFile(bin); err == nil {
		return b, nil
	}
	src, err := os.MkdirTemp("", "pause")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	main := "package main\n\nimport (\n\t\"os\"\n\t\"os/signal\"\n\t\"syscall\"\n)\n\nfunc main() {\n\tc := make(chan os.Signal, 1)\n\tsignal.Notify(c, syscall.SIGINT, syscall.SIGTERM)\n\t<-c\n}\n"
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(main), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module rig/pause\n\ngo 1.22\n"), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin+".new", ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build pause: %v: %s", err, out)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		return nil, err
	}
	return os.ReadFile(bin)
}

// Images pushed by the rig, relative to the registry address.
const (
	TeamAImage   = "team-a/app:v1"
	TeamBImage   = "team-b/app:v1"
	BusyboxImage = "rig/busybox:1.35"
)

// pushImages builds the test images and pushes them with credentials.
func pushImages(registry, user, password, toolsDir string) error {
	auth := remote.WithAuth(&authn.Basic{Username: user, Password: password})
	push := func(ref string, img v1.Image) error {
		tag, err := name.NewTag(registry+"/"+ref, name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.Write(tag, img, auth); err != nil {
			return fmt.Errorf("push %s: %w", tag, err)
		}
		return nil
	}

	for _, team := range []string{"team-a", "team-b"} {
		l, err := layer([]file{{name: "hello-" + team + ".txt", mode: 0o644, data: []byte(team + " app v1\n")}})
		if err != nil {
			return err
		}
		img, err := image(v1.Config{Cmd: []string{"/hello"}}, l)
		if err != nil {
			return err
		}
		if err := push(team+"/app:v1", img); err != nil {
			return err
		}
	}

	bbLayer, err := busyboxLayer()
	if err != nil {
		return err
	}
	busybox, err := image(v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}}, bbLayer)
	if err != nil {
		return err
	}
	for _, ref := range []string{BusyboxImage, "e2e-test-images/busybox:1.29-2"} {
		if err := push(ref, busybox); err != nil {
			return err
		}
	}

	pause, err := pauseBinary(toolsDir)
	if err != nil {
		return err
	}
	pl, err := layer([]file{{name: "pause", mode: 0o755, data: pause}})
	if err != nil {
		return err
	}
	// SIGKILL stops the sandbox at once. CRI-O stops a pod's infra
	// container with the image's stop signal (SIGTERM by default) and waits
	// out the caller's whole deadline if it does not end; a pause process,
	// PID 1 of its namespace, drops a SIGTERM that comes before its Go
	// runtime has installed its handlers, which a pod stopped right after it
	// started (critest does that) on a loaded machine hits. containerd stops
	// sandboxes with SIGKILL whatever the image says.
	pauseImg, err := image(v1.Config{Entrypoint: []string{"/pause"}, StopSignal: "SIGKILL"}, pl)
	if err != nil {
		return err
	}
	if err := push("pause:3.9", pauseImg); err != nil {
		return err
	}

	// critest's "Image Manager" images: busybox plus a marker, some with a
	// USER, exactly what cri-tools' images/build makes.
	p := "k8s-staging-cri-tools/"
	for _, c := range []struct {
		marker string
		refs   []string
		user   string
	}{
		{"test-image-latest", []string{"test-image-latest:latest"}, ""},
		{"test-image-tag", []string{"test-image-tag:test"}, ""},
		{"test-image-tag-all", []string{"test-image-tag:all"}, ""},
		{"test-image-1", []string{"test-image-1:latest"}, ""},
		{"test-image-2", []string{"test-image-2:latest"}, ""},
		{"test-image-3", []string{"test-image-3:latest"}, ""},
		{"test-image-tags", []string{"test-image-tags:1", "test-image-tags:2", "test-image-tags:3"}, ""},
		{"user-uid", []string{"test-image-user-uid:latest"}, "1002"},
		{"user-username", []string{"test-image-user-username:latest"}, "www-data"},
		{"user-uid-group", []string{"test-image-user-uid-group:latest"}, "1003:1004"},
		{"user-username-group", []string{"test-image-user-username-group:latest"}, "www-data:1004"},
	} {
		ml, err := layer([]file{{name: c.marker, mode: 0o644, data: []byte(c.marker + "\n")}})
		if err != nil {
			return err
		}
		img, err := image(v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}, User: c.user}, bbLayer, ml)
		if err != nil {
			return err
		}
		for _, ref := range c.refs {
			if err := push(p+ref, img); err != nil {
				return err
			}
		}
	}
	return nil
}

// PushMarker pushes an image of one layer, a file naming marker, to the
// authenticated registry as ref (relative to it) and returns its digest:
// an image that shares no layer with any other (it runs nothing), for
// tests where a shared base layer would tie images together.
func (r *Rig) PushMarker(ref, marker string) (string, error) {
	ml, err := layer([]file{{name: "marker", mode: 0o644, data: []byte(marker + "\n")}})
	if err != nil {
		return "", err
	}
	img, err := image(v1.Config{Cmd: []string{"cat", "/marker"}}, ml)
	if err != nil {
		return "", err
	}
	return r.pushAsUser(ref, img)
}

// PushBusybox pushes busybox plus a file naming marker to the
// authenticated registry as ref (relative to it) and returns its digest: a
// runnable image of its own, for tests that need fresh ones (a new marker
// under an existing tag moves the tag).
func (r *Rig) PushBusybox(ref, marker string) (string, error) {
	bb, err := busyboxLayer()
	if err != nil {
		return "", err
	}
	ml, err := layer([]file{{name: "marker", mode: 0o644, data: []byte(marker + "\n")}})
	if err != nil {
		return "", err
	}
	img, err := image(v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}}, bb, ml)
	if err != nil {
		return "", err
	}
	return r.pushAsUser(ref, img)
}

// pushAsUser pushes img to the authenticated registry as ref (relative to
// it), as the rig's user, and returns its digest.
func (r *Rig) pushAsUser(ref string, img v1.Image) (string, error) {
	tag, err := name.NewTag(r.Registry+"/"+ref, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img, remote.WithAuth(&authn.Basic{Username: "user", Password: Users["user"]})); err != nil {
		return "", fmt.Errorf("push %s: %w", tag, err)
	}
	d, err := img.Digest()
	return d.String(), err
}

// PushRealistic pushes busybox under n layers of size bytes each of
// random content (they do not compress: the registry serves about n x size
// bytes), plus a file naming marker, to the authenticated registry as ref,
// and returns its digest: an image of the size a pull takes seconds for,
// as pods' images do (the kubelet's SLO data puts a pull's median at 2 s),
// sharing no layer but busybox's with any other.
func (r *Rig) PushRealistic(ref, marker string, n, size int) (string, error) {
	bb, err := busyboxLayer()
	if err != nil {
		return "", err
	}
	layers := []v1.Layer{bb}
	for i := range n {
		data := make([]byte, size)
		if _, err := rand.Read(data); err != nil {
			return "", err
		}
		l, err := layer([]file{{name: fmt.Sprintf("%s-%d.bin", marker, i), mode: 0o644, data: data}})
		if err != nil {
			return "", err
		}
		layers = append(layers, l)
	}
	ml, err := layer([]file{{name: "marker", mode: 0o644, data: []byte(marker + "\n")}})
	if err != nil {
		return "", err
	}
	img, err := image(v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}}, append(layers, ml)...)
	if err != nil {
		return "", err
	}
	return r.pushAsUser(ref, img)
}

// PushBusyboxes pushes, for each ref, busybox plus a file naming its
// marker (markers[i] for refs[i]) to the authenticated registry, at most
// parallel at once, and returns their digests in the order of refs: many
// runnable images of their own (the soak's rotation), the busybox layer
// built once and uploaded once (the registry has it for the rest).
func (r *Rig) PushBusyboxes(refs, markers []string, parallel int) ([]string, error) {
	if len(refs) != len(markers) {
		return nil, fmt.Errorf("%d refs, %d markers", len(refs), len(markers))
	}
	bb, err := busyboxLayer()
	if err != nil {
		return nil, err
	}
	// The first push uploads the shared layer; the others find it there.
	digests := make([]string, len(refs))
	pushOne := func(i int) error {
		ml, err := layer([]file{{name: "marker", mode: 0o644, data: []byte(markers[i] + "\n")}})
		if err != nil {
			return err
		}
		img, err := image(v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}}, bb, ml)
		if err != nil {
			return err
		}
		digests[i], err = r.pushAsUser(refs[i], img)
		return err
	}
	if len(refs) == 0 {
		return nil, nil
	}
	if err := pushOne(0); err != nil {
		return nil, err
	}
	next := make(chan int)
	errs := make(chan error, parallel)
	for range max(parallel, 1) {
		go func() {
			var first error
			for i := range next {
				if err := pushOne(i); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	for i := 1; i < len(refs); i++ {
		next <- i
	}
	close(next)
	var all []error
	for range max(parallel, 1) {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	if len(all) > 0 {
		return nil, all[0]
	}
	return digests, nil
}
