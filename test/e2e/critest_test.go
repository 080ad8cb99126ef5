package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// junitReport is the part of ginkgo's JUnit report we read.
type junitReport struct {
	Suites []struct {
		Cases []struct {
			Name    string    `xml:"name,attr"`
			Status  string    `xml:"status,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// critestOutcome is the set of passed and failed specs of one critest run.
type critestOutcome struct {
	passed, failed []string
}

// runCritest runs critest against endpoint and reads its JUnit report.
func runCritest(t *testing.T, endpoint, name string, args ...string) critestOutcome {
	t.Helper()
	report := filepath.Join(testRig.Dir, "critest-"+name+".xml")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	res := testRig.Critest(ctx, endpoint, append(args, "--ginkgo.junit-report="+report)...)
	// critest exits non-zero when any spec fails; the report tells which.
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("critest %s wrote no report (%v): %v\n%s\n%s", name, res.Err, err, tail(res.Stdout, 40), tail(res.Stderr, 20))
	}
	var r junitReport
	if err := xml.Unmarshal(data, &r); err != nil {
		t.Fatalf("critest report %s: %v", report, err)
	}
	var out critestOutcome
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if !strings.HasPrefix(c.Name, "[It]") {
				continue // [BeforeSuite] and friends are not specs
			}
			switch {
			case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
			case c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked":
				out.failed = append(out.failed, c.Name)
			default:
				out.passed = append(out.passed, c.Name)
			}
		}
	}
	sort.Strings(out.passed)
	sort.Strings(out.failed)
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestCritestImageManager runs critest's image conformance specs through
// the proxy and directly. The digest spec pins an upstream image that
// cannot exist offline; it is skipped both ways.
func TestCritestImageManager(t *testing.T) {
	needRig(t)
	args := []string{"--ginkgo.focus=Image Manager", "--ginkgo.skip=with digest"}
	d := runCritest(t, direct(), "image-direct", args...)
	p := runCritest(t, proxied(), "image-proxied", args...)
	t.Logf("direct: %d passed, %d failed %v", len(d.passed), len(d.failed), d.failed)
	t.Logf("proxied: %d passed, %d failed %v", len(p.passed), len(p.failed), p.failed)
	if len(p.passed) != 7 || len(p.failed) != 0 {
		t.Errorf("through the proxy: %d passed, %d failed %v; want 7 passed, 0 failed", len(p.passed), len(p.failed), p.failed)
	}
	if len(d.passed) != 7 || len(d.failed) != 0 {
		t.Errorf("direct: %d passed, %d failed %v; want 7 passed, 0 failed", len(d.passed), len(d.failed), d.failed)
	}
}

// TestCritestFullSuiteSameAsDirect runs the whole critest suite directly
// and through the proxy: the proxy must not change a single outcome. Some
// specs fail both ways on this offline rig (upstream images that cannot be
// recreated, Debian busybox without ipcs, containerd 1.6 vs critest 1.34
// semantics); both lists are printed.
func TestCritestFullSuiteSameAsDirect(t *testing.T) {
	needRig(t)
	if testing.Short() {
		t.Skip("the full critest suite takes minutes; skipped with -short")
	}
	d := runCritest(t, direct(), "full-direct")
	p := runCritest(t, proxied(), "full-proxied")
	report := func(name string, o critestOutcome) string {
		return fmt.Sprintf("%s: %d passed, %d failed\n  failed: %s", name, len(o.passed), len(o.failed), strings.Join(o.failed, "\n          "))
	}
	t.Log("\n" + report("direct", d) + "\n" + report("proxied", p))
	if strings.Join(d.passed, "\n") != strings.Join(p.passed, "\n") || strings.Join(d.failed, "\n") != strings.Join(p.failed, "\n") {
		t.Errorf("outcomes differ:\n only direct passed: %v\n only proxied passed: %v", minus(d.passed, p.passed), minus(p.passed, d.passed))
	}
	if len(p.passed) < 50 {
		t.Errorf("only %d specs passed: the rig is broken, not just offline", len(p.passed))
	}
}

// minus returns the elements of a not in b.
func minus(a, b []string) []string {
	in := make(map[string]bool, len(b))
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	return out
}
