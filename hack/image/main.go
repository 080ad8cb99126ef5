package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const binary = "/usr/local/bin/cri-image-proxy"

// caBundle is Debian's (package ca-certificates), copied into the image.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

type options struct {
	binDir, version, revision, ociLayout, push string
	platforms                                  []string
	created                                    time.Time
}

func main() {
	var o options
	var platforms, created string
	flag.StringVar(&o.binDir, "bin-dir", "_output/release", "where make release put cri-image-proxy-OS-ARCH")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH")
	flag.StringVar(&o.version, "version", "devel", "the image's version label")
	flag.StringVar(&o.revision, "revision", "", "the image's revision label (the commit)")
	flag.StringVar(&created, "created", "", "the image's creation time, RFC 3339 (default the Unix epoch, for reproducible digests)")
	flag.StringVar(&o.ociLayout, "oci-layout", "", "write an OCI image layout to this directory")
	flag.StringVar(&o.push, "push", "", "push the index to this reference (credentials from the docker config)")
	flag.Parse()
	o.platforms = strings.Split(platforms, ",")
	if created != "" {
		t, err := time.Parse(time.RFC3339, created)
		if err != nil {
			fmt.Fprintf(os.Stderr, "image: -created %q: %v\n", created, err)
			os.Exit(2)
		}
		o.created = t
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.ociLayout == "" && o.push == "" {
		return errors.New("nothing to do: give -oci-layout DIR, -push REF or both")
	}
	idx, err := build(o)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if o.ociLayout != "" {
		if err := os.RemoveAll(o.ociLayout); err != nil {
			return err
		}
		if _, err := layout.Write(o.ociLayout, idx); err != nil {
			return fmt.Errorf("writing the OCI layout %s: %w", o.ociLayout, err)
		}
		fmt.Printf("%s: OCI layout, index %s\n", o.ociLayout, digest)
	}
	if o.push != "" {
		ref, err := name.ParseReference(o.push)
		if err != nil {
			return fmt.Errorf("-push %q: %w", o.push, err)
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", ref, err)
		}
		fmt.Printf("%s@%s: pushed\n", ref, digest)
	}
	return nil
}

// build makes the index: one image per platform.
func build(o options) (v1.ImageIndex, error) {
	base, err := baseLayer()
	if err != nil {
		return nil, err
	}
	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for _, p := range o.platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("-platforms: %w", err)
		}
		bin := filepath.Join(o.binDir, fmt.Sprintf("cri-image-proxy-%s-%s", plat.OS, plat.Architecture))
		data, err := os.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("the %s binary: %w (make release builds it)", p, err)
		}
		bl, err := layer([]file{{name: "usr/local/bin/cri-image-proxy", mode: 0o755, data: data}})
		if err != nil {
			return nil, err
		}
		img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), base, bl)
		if err != nil {
			return nil, err
		}
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
		cf.Created = v1.Time{Time: o.created}
		cf.Config.Entrypoint = []string{binary}
		cf.Config.Cmd = []string{"serve"}
		cf.Config.User = "0:0"
		cf.Config.Env = []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=" + caBundle}
		cf.Config.Labels = map[string]string{
			"org.opencontainers.image.title":    "cri-image-proxy",
			"org.opencontainers.image.version":  o.version,
			"org.opencontainers.image.revision": o.revision,
			"org.opencontainers.image.licenses": "Apache-2.0",
		}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	return idx, nil
}

// baseLayer is everything but the binary: the CA bundle, passwd and group
// files naming root and nobody, and a world-writable /tmp.
func baseLayer() (v1.Layer, error) {
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("the CA bundle: %w (Debian's ca-certificates package)", err)
	}
	return layer([]file{
		{name: "etc", mode: 0o755, dir: true},
		{name: "etc/ssl", mode: 0o755, dir: true},
		{name: "etc/ssl/certs", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{name: "tmp", mode: 0o1777, dir: true},
		{name: "usr", mode: 0o755, dir: true},
		{name: "usr/local", mode: 0o755, dir: true},
		{name: "usr/local/bin", mode: 0o755, dir: true},
	})
}

type file struct {
	name string
	mode int64
	data []byte
	dir  bool
}

// layer writes files, in the order given, as an uncompressed tar owned by
// root with the epoch as every time; go-containerregistry gzips it.
func layer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if f.dir {
			h.Name, h.Typeflag, h.Size = f.name+"/", tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, tarball.WithMediaType(types.OCILayer))
}
