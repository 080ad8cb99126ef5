package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fieldPaths lists the JSON paths of every field of t, sections first
// ("credentialProviders", then "credentialProviders.config", ...).
func fieldPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		// A nested struct of our own is a section: its fields are listed; a
		// pointer to one (an optional section) is listed itself as well.
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() {
			if f.Type.Kind() == reflect.Pointer {
				out = append(out, path)
			}
			out = append(out, fieldPaths(ft, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

func TestEveryFieldIsDocumented(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	// The first cell of each table row: | `path` | ...
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z.]+)` \\|")
	var documented []string
	for _, m := range row.FindAllStringSubmatch(string(data), -1) {
		documented = append(documented, m[1])
	}
	fields := fieldPaths(reflect.TypeOf(ProxyConfiguration{}), "")
	for _, f := range fields {
		if !slices.Contains(documented, f) {
			t.Errorf("docs/configuration.md has no row for %s", f)
		}
	}
	for _, d := range documented {
		if !slices.Contains(fields, d) {
			t.Errorf("docs/configuration.md documents %s, which the configuration does not have", d)
		}
	}
	if len(fields) < 25 {
		t.Errorf("only %d fields found: the walk is broken", len(fields))
	}
}
