package configfiles

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, f := range []string{"b.yaml", "a.json", "c.yml", "notes.md"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       []string
		err        string
	}{
		{"a directory's json and yaml files come in lexicographic order, others left out", dir, []string{"a.json", "b.yaml", "c.yml"}, ""},
		{"a file is itself, whatever its name", filepath.Join(dir, "notes.md"), []string{"notes.md"}, ""},
		{"a directory without configuration files is an error", filepath.Join(dir, "d.yaml"), nil, "no *.json, *.yaml or *.yml file in directory"},
		{"a missing path is an error", filepath.Join(dir, "absent"), nil, "no such file"},
		{"no path is an error", "", nil, "no path given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := List(tc.path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, f := range got {
				names = append(names, filepath.Base(f))
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got %v, want %v", names, tc.want)
			}
		})
	}
}
