package bake

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/distribution/reference"
)

// ParseList reads an image list: one image reference a line; blank lines
// and comments (from a # at the start of a line or after a space) are
// skipped. References are normalized (docker.io/library/, :latest) and
// listed once each, in order of first appearance. An error names the file
// (name) and line.
func ParseList(r io.Reader, name string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := commentStart(line); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		named, err := reference.ParseNormalizedNamed(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %q is not an image reference: %w", name, n, line, err)
		}
		ref := reference.TagNameOnly(named).String()
		if !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// commentStart is where a comment begins in line, -1 without one.
func commentStart(line string) int {
	for i, c := range line {
		if c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
			return i
		}
	}
	return -1
}
