package imagepolicy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestDocsExamples: every ImagePolicyConfig of docs/image-policy.md
// decodes strictly and validates but for its executables, so the page
// shows what the proxy takes.
func TestDocsExamples(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/image-policy.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		if !strings.Contains(m[1], "kind: "+ConfigKind) {
			continue
		}
		n++
		fc, err := decodeConfig([]byte(m[1]))
		if err != nil {
			t.Errorf("example %d: %v\n%s", n, err, m[1])
			continue
		}
		for i, pc := range fc.Providers {
			_, errs := validateProvider(field.NewPath("providers").Index(i), pc, "testdata/bin")
			if len(errs) > 0 {
				t.Errorf("example %d: %v", n, errs.ToAggregate())
			}
		}
	}
	if n == 0 {
		t.Error("no ImagePolicyConfig example in docs/image-policy.md")
	}
}

// TestTheExampleFile: deploy/examples/image-policy.yaml decodes strictly
// and validates but for its executables and paths, and says what the
// documentation does.
func TestTheExampleFile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../deploy/examples/image-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fc, err := decodeConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	rules := NoMatchRules{Default: NoMatchAllow, Namespaces: map[string]NoMatchPolicy{}}
	if errs := mergeNoMatch(&rules, fc.NoMatchPolicy, "example", map[string]string{}); len(errs) > 0 {
		t.Error(errs.ToAggregate())
	}
	if rules.For("payments") != NoMatchDeny || rules.For("staging") != NoMatchWarn || rules.For("other") != NoMatchAllow {
		t.Errorf("noMatchPolicy %+v", rules)
	}
	for i, pc := range fc.Providers {
		p, errs := validateProvider(field.NewPath("providers").Index(i), pc, "testdata/bin")
		if len(errs) > 0 {
			t.Errorf("provider %d: %v", i, errs.ToAggregate())
		}
		if len(p.WatchFiles) == 0 {
			t.Errorf("provider %d watches nothing", i)
		}
	}
}
