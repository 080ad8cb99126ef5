package records

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
)

func TestParsePreloadedList(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, data string
		want       []string
	}{
		{"nothing", "", nil},
		{"a name a line, trimmed", "  busybox:1.36 \nregistry.test/team/app:v1\n", []string{"busybox:1.36", "registry.test/team/app:v1"}},
		{"comments and blank lines are skipped", "# preloaded by the image\n\nbusybox:1.36 # the shell\n   # indented\n", []string{"busybox:1.36"}},
		{"an ID is kept as written", "sha256:" + strings.Repeat("a", 64) + "\n", []string{"sha256:" + strings.Repeat("a", 64)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParsePreloadedList([]byte(tc.data)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWithoutPreloaded(t *testing.T) {
	t.Parallel()
	idA, idB := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	images := []Image{
		NodeImage(idA, []string{"registry.test/team/app:v1", "mirror.test/team/app:v1", "registry.test/team/app@" + idA}),
		NodeImage(idB, []string{"busybox:1.36"}),
	}
	for _, tc := range []struct {
		name      string
		preloaded []string
		want      map[string][]string // image ID -> repositories left to mark
		wantErr   string
	}{
		{"nothing named: every image, every repository", nil,
			map[string][]string{idA: {"registry.test/team/app", "mirror.test/team/app"}, idB: {"docker.io/library/busybox"}}, ""},
		{"a name takes out its repository of the image only", []string{"mirror.test/team/app:v1"},
			map[string][]string{idA: {"registry.test/team/app"}, idB: {"docker.io/library/busybox"}}, ""},
		{"a short name is matched normalized, and an image left with no repository is out", []string{"busybox:1.36"},
			map[string][]string{idA: {"registry.test/team/app", "mirror.test/team/app"}}, ""},
		{"an ID takes out the whole image, with or without sha256:", []string{strings.Repeat("a", 64)},
			map[string][]string{idB: {"docker.io/library/busybox"}}, ""},
		{"a name of another tag is not the image", []string{"mirror.test/team/app:v2"}, nil, "mirror.test/team/app:v2: no such image on the node"},
		{"an ID not on the node is an error", []string{"sha256:" + strings.Repeat("c", 64)}, nil, "no such image on the node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := NodeImage(idA, images[0].Names)
			got, err := WithoutPreloaded(images, tc.preloaded)
			if !reflect.DeepEqual(images[0], before) {
				t.Errorf("the images given changed: %v, was %v", images[0], before)
			}
			if !errorAsWanted(t, err, tc.wantErr) {
				return
			}
			m := map[string][]string{}
			for _, img := range got {
				m[img.ID] = img.Repositories
			}
			if !reflect.DeepEqual(m, tc.want) {
				t.Errorf("got %v, want %v", m, tc.want)
			}
		})
	}
}

// layersOf is a runtime that knows the layers of some images.
type layersOf map[string][]digest.Digest

func (l layersOf) ImageLayers(_ context.Context, id string) ([]digest.Digest, bool, error) {
	if id == "broken" {
		return nil, false, errors.New("runtime down")
	}
	d, ok := l[id]
	return d, ok, nil
}

func TestPreloadedLayers(t *testing.T) {
	t.Parallel()
	l1, l2 := digest.FromString("layer 1"), digest.FromString("layer 2")
	rt := layersOf{"wholly": {l1, l2}, "partly": {l1}, "marked": {l2}}
	all := []Image{{ID: "wholly"}, {ID: "partly"}, {ID: "marked"}, {ID: "unknown"}}
	for _, tc := range []struct {
		name    string
		all     []Image
		present []Image
		want    map[string][]digest.Digest
		wantErr string
	}{
		{"only the images left out of present are asked, and one the runtime cannot say is left out",
			all, []Image{{ID: "partly"}, {ID: "marked"}}, map[string][]digest.Digest{"wholly": {l1, l2}}, ""},
		{"nothing left out: nothing asked", all, all, map[string][]digest.Digest{}, ""},
		{"the runtime failing is an error naming the image", []Image{{ID: "broken"}}, nil, nil, "the layers of broken: runtime down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PreloadedLayers(context.Background(), rt, tc.all, tc.present)
			if !errorAsWanted(t, err, tc.wantErr) {
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// errorAsWanted fails the test unless err says want ("": no error), and
// reports whether the call succeeded, so that its result is worth checking.
func errorAsWanted(t *testing.T, err error, want string) bool {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatal(err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("got %v, want an error saying %q", err, want)
	}
	return err == nil
}
