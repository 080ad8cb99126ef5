package main

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// TestDocsExamples: every SigstoreImagePolicy of docs/image-policy.md
// decodes strictly (its key and trusted root files are the reader's).
func TestDocsExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/image-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		if !strings.Contains(m[1], "kind: "+PolicyKind) {
			continue
		}
		n++
		js, err := yaml.YAMLToJSONStrict([]byte(m[1]))
		if err != nil {
			t.Fatalf("example %d: %v", n, err)
		}
		var pf policyFile
		strict, err := kjson.UnmarshalStrict(js, &pf, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err == nil {
			err = errors.Join(strict...)
		}
		if err != nil || pf.APIVersion != PolicyAPIVersion || len(pf.Policies) == 0 {
			t.Errorf("example %d: %v\n%s", n, err, m[1])
		}
		for _, p := range pf.Policies {
			for _, a := range p.Authorities {
				if (a.Key == nil) == (a.Keyless == nil) {
					t.Errorf("example %d: authority %s has not exactly one of key and keyless", n, a.Name)
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("%d SigstoreImagePolicy examples in docs/image-policy.md, want the key and the keyless one", n)
	}
}
