package execplugin

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

func TestConfigFiles(t *testing.T) {
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
			got, err := ConfigFiles(tc.path)
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

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, files map[string]string) string {
		t.Helper()
		dir := t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	// decode takes each line of a file for a provider name; "bad" fails
	// the file, "-x" is a provider with an error.
	var seen []string
	decode := func(f *ConfigFile) {
		for i, name := range strings.Fields(string(f.Data)) {
			p := field.NewPath("providers").Index(i)
			switch {
			case name == "bad":
				f.Fail(errors.New("does not decode"))
				return
			case strings.HasPrefix(name, "-"):
				f.FailProvider(name, field.ErrorList{field.Invalid(p.Child("name"), name, "a dash")})
			}
			f.Declare(p.Child("name"), name)
			seen = append(seen, filepath.Base(f.Path)+":"+name)
		}
	}

	t.Run("files are read in order and every error is reported at once, naming the configuration, the file, the provider and the field", func(t *testing.T) {
		seen = nil
		dir := write(t, map[string]string{"a.yaml": "one -x", "b.yaml": "bad", "c.yaml": "two one"})
		_, err := LoadConfig("test config", dir, decode)
		if err == nil {
			t.Fatal("loaded")
		}
		for _, w := range []string{
			"test config " + filepath.Join(dir, "a.yaml") + `: provider "-x": providers[1].name: Invalid value: "-x": a dash`,
			"test config " + filepath.Join(dir, "b.yaml") + ": does not decode",
			"test config " + filepath.Join(dir, "c.yaml") + `: provider "one": providers[1].name: Duplicate value: "one": also declared in ` + filepath.Join(dir, "a.yaml"),
		} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error lacks %q:\n%v", w, err)
			}
		}
		if got := strings.Join(seen, ","); got != "a.yaml:one,a.yaml:-x,c.yaml:two,c.yaml:one" {
			t.Errorf("decoded %s", got)
		}
	})
	t.Run("an empty name is not declared: it is an error of its own", func(t *testing.T) {
		dir := write(t, map[string]string{"a.yaml": "x"})
		_, err := LoadConfig("test config", dir, func(f *ConfigFile) {
			f.Declare(field.NewPath("providers").Index(0).Child("name"), "")
			f.Declare(field.NewPath("providers").Index(1).Child("name"), "")
		})
		if err != nil {
			t.Errorf("got %v", err)
		}
	})
	t.Run("the hash is the content of the files in order, and only it", func(t *testing.T) {
		nothing := func(*ConfigFile) {}
		a, err := LoadConfig("test config", write(t, map[string]string{"a.yaml": "one", "b.yaml": "two"}), nothing)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := LoadConfig("test config", write(t, map[string]string{"x.yaml": "one", "y.yaml": "two"}), nothing)
		swapped, _ := LoadConfig("test config", write(t, map[string]string{"a.yaml": "two", "b.yaml": "one"}), nothing)
		joined, _ := LoadConfig("test config", write(t, map[string]string{"a.yaml": "onet", "b.yaml": "wo"}), nothing)
		if !strings.HasPrefix(a, "sha256:") || a != again || a == swapped || a == joined {
			t.Errorf("hashes %s %s %s %s", a, again, swapped, joined)
		}
	})
	t.Run("a path that stands for no file fails at once, naming the configuration", func(t *testing.T) {
		_, err := LoadConfig("test config", t.TempDir(), func(*ConfigFile) { t.Error("decoded") })
		if err == nil || !strings.HasPrefix(err.Error(), "test config: no *.json") {
			t.Errorf("got %v", err)
		}
	})
}

func TestValidateEntry(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	testkit.WritePlugin(t, bin, "plugin", "")
	if err := os.WriteFile(filepath.Join(bin, "not-executable"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	versions := []string{"test.io/v1", "test.io/v1beta1"}
	ok := Entry{Name: "plugin", APIVersion: "test.io/v1", MatchImages: []string{"registry.test", "*.test:5000/team"}, Env: []EnvVar{{Name: "A", Value: "b"}}}
	for _, tc := range []struct {
		name   string
		change func(e *Entry)
		want   []string
	}{
		{"a valid entry passes", func(*Entry) {}, nil},
		{"no name is required", func(e *Entry) { e.Name = "" }, []string{"p.name: Required value"}},
		{"a name with a slash is refused", func(e *Entry) { e.Name = "../plugin" }, []string{`p.name: Invalid value: "../plugin": provider name cannot contain '/'`}},
		{"a name with a space is refused", func(e *Entry) { e.Name = "a plugin" }, []string{"provider name cannot contain spaces"}},
		{"'..' is refused", func(e *Entry) { e.Name = ".." }, []string{"provider name cannot be '.' or '..'"}},
		{"a name that is no executable in the bin directory is refused, naming it", func(e *Entry) { e.Name = "absent" }, []string{"p.name: Invalid value", "no executable " + filepath.Join(bin, "absent") + " in the bin directory"}},
		{"a file that cannot be executed is refused", func(e *Entry) { e.Name = "not-executable" }, []string{"no executable " + filepath.Join(bin, "not-executable")}},
		{"no apiVersion is required, the supported ones named", func(e *Entry) { e.APIVersion = "" }, []string{"p.apiVersion: Required value: one of test.io/v1, test.io/v1beta1"}},
		{"another apiVersion is refused", func(e *Entry) { e.APIVersion = "test.io/v2" }, []string{`p.apiVersion: Unsupported value: "test.io/v2"`}},
		{"no matchImages are refused", func(e *Entry) { e.MatchImages = nil }, []string{"p.matchImages: Required value"}},
		{"an invalid matchImage is refused with its index", func(e *Entry) { e.MatchImages = append(e.MatchImages, "%zz") }, []string{"p.matchImages[2]: Invalid value", "match image is invalid"}},
		{"an env var without a name is refused", func(e *Entry) { e.Env = append(e.Env, EnvVar{Value: "x"}) }, []string{"p.env[1].name: Required value"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ok
			e.MatchImages = slices.Clone(ok.MatchImages)
			e.Env = slices.Clone(ok.Env)
			tc.change(&e)
			errs := ValidateEntry(field.NewPath("p"), e, bin, versions)
			if len(tc.want) == 0 && len(errs) > 0 {
				t.Fatalf("got %v", errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs.ToAggregate().Error(), w) {
					t.Errorf("errors lack %q: %v", w, errs)
				}
			}
		})
	}
}

func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	type entry struct {
		Name string   `json:"name"`
		Args []string `json:"args,omitempty"`
	}
	type file struct {
		Providers []entry `json:"providers"`
	}
	for _, tc := range []struct {
		name, data string
		want       string // in the error; "" decodes
	}{
		{"YAML decodes", "providers:\n  - name: a\n    args: [x]\n", ""},
		{"JSON decodes", `{"providers": [{"name": "a"}]}`, ""},
		{"a misspelt field is an error naming its path", "providers:\n  - name: a\n    arg: [x]\n", `unknown field "providers[0].arg"`},
		{"a duplicate field is an error", "providers:\n  - name: a\n    name: b\n", `"name"`},
		{"a wrong type is an error", "providers: {name: a}\n", "providers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f file
			err := DecodeStrict([]byte(tc.data), &f)
			if tc.want == "" {
				if err != nil || len(f.Providers) != 1 || f.Providers[0].Name != "a" {
					t.Errorf("got %+v, %v", f, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
