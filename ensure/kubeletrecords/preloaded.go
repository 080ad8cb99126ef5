package kubeletrecords

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// PreloadedDir is the kubelet's directory of ImagePreloadedRecord files,
// under <root>/image_manager, in the upstream change
// https://github.com/kubernetes/kubernetes/pull/139156 (the name, the
// files' layout and their JSON are that change's, its
// testdata/observed-preloaded).
const PreloadedDir = "observed-preloaded"

// PreloadedRecord is the kubelet's ImagePreloadedRecord, as the proxy
// stores it too (records.PreloadedRecord), with the kubelet's keys in
// these files: repositories.
type PreloadedRecord = records.PreloadedRecord

// DecodePreloaded decodes one preloaded record file, strictly, as
// DecodeRecord does.
func DecodePreloaded(data []byte) (*PreloadedRecord, error) {
	r := &PreloadedRecord{}
	if err := decodeStrict(data, "ImagePreloadedRecord", r); err != nil {
		return nil, err
	}
	if r.ImageRef == "" {
		return nil, errors.New("no imageRef")
	}
	r.APIVersion = kubeletconfigv1beta1.SchemeGroupVersion.String()
	return r, nil
}

// ReadPreloaded reads the kubelet's preloaded records under dir (its
// image_manager directory), as Read reads its other records: a missing
// directory is empty (a kubelet without the change has none), a file that
// cannot be decoded, or whose image ID does not hash to its name, is an
// error naming it, and nothing is returned. skipped counts the files the
// kubelet skips too.
func ReadPreloaded(dir string) (recs []*PreloadedRecord, skipped int, err error) {
	var rep ReadReport
	err = eachFile(filepath.Join(dir, PreloadedDir), &rep, func(name string, data []byte) error {
		r, err := DecodePreloaded(data)
		if err != nil {
			return err
		}
		if FileName(r.ImageRef) != name {
			return fmt.Errorf("holds image %q, whose file would be %s", r.ImageRef, FileName(r.ImageRef))
		}
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		return nil, rep.Skipped, err
	}
	return recs, rep.Skipped, nil
}

// forKubeletPreloaded is p as the kubelet keys it: the repositories of its
// names. A repository the image's record rec also maps (the image was
// pulled as it, by someone) is left out, and counted in leftOut: the
// kubelet keeps a repository preloaded only until it pulls it with
// credentials, and a repository cannot say which of its tags were
// preloaded and which a tenant pulled. Left out, those names need
// verification under the kubelet, as they do in its own records; nothing
// a tenant pulled is handed out.
func forKubeletPreloaded(p *PreloadedRecord, rec *Record) (out *PreloadedRecord, leftOut int) {
	out = &PreloadedRecord{LastUpdatedTime: p.LastUpdatedTime, ImageRef: p.ImageRef, ObservedImages: map[string]records.PreloadedImage{}}
	out.APIVersion, out.Kind = kubeletconfigv1beta1.SchemeGroupVersion.String(), "ImagePreloadedRecord"
	for _, name := range p.Names() {
		repo, ok := imageref.Repository(name)
		if !ok {
			continue
		}
		if _, pulled := mapping(rec)[repo]; pulled {
			leftOut++
			continue
		}
		out.ObservedImages[repo] = records.PreloadedImage{}
	}
	return out, leftOut
}

// mapping is r's credential mapping, none for no record.
func mapping(r *Record) map[string]kubeletconfigv1beta1.ImagePullCredentials {
	if r == nil {
		return nil
	}
	return r.CredentialMapping
}

// writePreloaded writes pre, the preloaded records of recs' images, into
// dir/observed-preloaded as the kubelet keys them (forKubeletPreloaded),
// merged with the kubelet's own file of an image (the union of the
// repositories, the later update time); one that does not decode is an
// error, not overwritten.
func writePreloaded(dir string, recs []*Record, pre []*PreloadedRecord, rep *WriteReport) error {
	byRef := make(map[string]*Record, len(recs))
	for _, r := range recs {
		byRef[r.ImageRef] = r
	}
	sub := filepath.Join(dir, PreloadedDir)
	for _, p := range pre {
		out, left := forKubeletPreloaded(p, byRef[p.ImageRef])
		rep.PreloadedLeftOut += left
		if len(out.ObservedImages) == 0 {
			continue
		}
		if err := os.MkdirAll(sub, 0o700); err != nil {
			return err
		}
		path := filepath.Join(sub, FileName(p.ImageRef))
		if data, err := os.ReadFile(path); err == nil {
			have, err := DecodePreloaded(data)
			if err != nil {
				return fmt.Errorf("%s: %w (not overwritten)", path, err)
			}
			if have.ImageRef != p.ImageRef {
				return fmt.Errorf("%s: holds image %q (not overwritten)", path, have.ImageRef)
			}
			maps.Copy(out.ObservedImages, have.ObservedImages)
			if have.LastUpdatedTime.After(out.LastUpdatedTime.Time) {
				out.LastUpdatedTime = have.LastUpdatedTime
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := writeJSON(path, out); err != nil {
			return err
		}
		rep.Preloaded++
	}
	if _, err := os.Stat(sub); err != nil {
		return nil // nothing written
	}
	return syncOne(sub)
}

// fromKubeletPreloaded turns the kubelet's preloaded records into the
// proxy's, by full name: each observed repository of an image becomes the
// names node lists the image under in that repository now (the kubelet
// keeps a repository only while it has not pulled it, so those names were
// preloaded), less the repositories the image's kubelet record (kubelet)
// or the database's record (have) maps: pulled as them, by someone, they
// stay so (the kubelet's own rule: a pulled name is decided by its record).
// An image with no record on either side needs none: with no record it is
// preloaded by every name. leftOut counts the repositories not carried.
func fromKubeletPreloaded(p *PreloadedRecord, kubelet, have map[string]bool, img *records.Image) (out *PreloadedRecord, leftOut int) {
	out = &PreloadedRecord{LastUpdatedTime: p.LastUpdatedTime, ImageRef: p.ImageRef, ObservedImages: map[string]records.PreloadedImage{}}
	for key := range p.ObservedImages {
		n := imageref.Parse(key)
		switch {
		case !n.OK, kubelet[n.Repository], have[n.Repository], img == nil:
			leftOut++
			continue
		case key != n.Repository:
			// A full name, where the kubelet writes repositories: taken
			// as it is, if the image is still listed under it.
			if slices.ContainsFunc(img.Names, func(name string) bool { return imageref.Parse(name).Lookup() == n.Lookup() }) {
				out.ObservedImages[n.Lookup()] = records.PreloadedImage{}
				continue
			}
			leftOut++
			continue
		}
		found := false
		for _, name := range img.Names {
			if m := imageref.Parse(name); m.OK && m.Repository == n.Repository {
				out.ObservedImages[m.Lookup()] = records.PreloadedImage{}
				found = true
			}
		}
		if !found {
			leftOut++
		}
	}
	return out, leftOut
}
