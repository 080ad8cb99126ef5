package bake

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	t.Parallel()
	t.Run("a list with comments, blank lines and a duplicate gives each image once, normalized", func(t *testing.T) {
		f, err := os.Open("testdata/images.txt")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got, err := ParseList(f, "images.txt")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"registry.example.com/team-a/app:v1",
			"docker.io/library/nginx:latest",
			"docker.io/library/busybox:1.36",
			"registry.example.com:5000/base@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		}
		if !slices.Equal(got, want) {
			t.Errorf("got %q\nwant %q", got, want)
		}
	})
	for _, tc := range []struct {
		name, list, want string
	}{
		{"an invalid reference names the file and line", "nginx\nNot An Image\n", `images:2: "Not An Image" is not an image reference`},
		{"upper case in a repository is refused by line", "# c\nregistry.test/Team/app\n", "images:2:"},
		{"a hash inside a word is not a comment", "registry.test/app#1\n", "images:1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseList(strings.NewReader(tc.list), "images")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("an empty list is no error and no image", func(t *testing.T) {
		got, err := ParseList(strings.NewReader("# nothing\n\n"), "images")
		if err != nil || len(got) != 0 {
			t.Errorf("got %q, %v", got, err)
		}
	})
}

func FuzzParseList(f *testing.F) {
	data, _ := os.ReadFile("testdata/images.txt")
	f.Add(string(data))
	f.Add("a#b\n#\n \t# x\nnginx:1")
	f.Fuzz(func(t *testing.T, list string) {
		images, err := ParseList(strings.NewReader(list), "fuzz")
		if err != nil {
			return
		}
		// What it accepts, it accepts again unchanged: normalized and unique.
		again, err := ParseList(strings.NewReader(strings.Join(images, "\n")), "again")
		if err != nil || !slices.Equal(images, again) {
			t.Errorf("%q re-parsed as %q (%v)", images, again, err)
		}
	})
}
