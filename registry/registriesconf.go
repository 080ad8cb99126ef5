package registry

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"github.com/pelletier/go-toml/v2"
)

// DefaultRegistriesConf is where CRI-O (containers/image) reads its
// registries: this file, then the drop-ins of DefaultRegistriesConf+".d".
const DefaultRegistriesConf = "/etc/containers/registries.conf"

// DefaultCertsDir is where containers/image looks, in order, for a
// registry's <host[:port]>/ TLS files when it runs as root (CRI-O).
const DefaultCertsDir = "/etc/containers/certs.d:/etc/docker/certs.d"

// This file reads containers-registries.conf(5), version 2, as
// containers/image (go.podman.io/image/v5/pkg/sysregistriesv2) reads it for
// CRI-O: only what the registry check needs (which [[registry]] an image
// matches, its location, insecure, blocked and mirrors), and every check
// that makes containers/image refuse a file, so that a file the runtime
// refuses is refused here too. It is not that package: that one links
// containers/storage (a cgo constructor at process start, mount and user
// namespace code) and moves the daemon's bbolt and logrus, for a TOML file
// (README, "Libraries chosen"). Keys the check does not use (aliases,
// credential-helpers, ...) are ignored, as containers/image ignores keys it
// does not know.

// registriesConf is what the node's registries.conf and its drop-ins say.
type registriesConf struct {
	// files are the files read, in order: the main file (when it exists),
	// then the drop-ins by name.
	files []string
	// registries are the [[registry]] entries of every file merged (a
	// drop-in's entry replaces the one of the same prefix), sorted by
	// prefix: the order in which containers/image breaks a tie.
	registries []confRegistry
	// fingerprint identifies the files' state when they were read.
	fingerprint string
}

// confEndpoint is a location: the registry's own, or a mirror's.
type confEndpoint struct {
	Location       string `toml:"location"`
	Insecure       bool   `toml:"insecure"`
	PullFromMirror string `toml:"pull-from-mirror"`
	NamespaceProxy string `toml:"namespace-proxy"`
}

// confRegistry is a [[registry]] entry.
type confRegistry struct {
	Prefix string `toml:"prefix"`
	confEndpoint
	Mirrors            []confEndpoint `toml:"mirror"`
	Blocked            bool           `toml:"blocked"`
	MirrorByDigestOnly bool           `toml:"mirror-by-digest-only"`

	file string // the file that defined it, for errors and the doctor
}

// confFile is one file's content, as far as the check reads it.
type confFile struct {
	Registries                  []confRegistry `toml:"registry"`
	UnqualifiedSearchRegistries []string       `toml:"unqualified-search-registries"`
	ShortNameMode               string         `toml:"short-name-mode"`
	// V1 is the v1 format's [registries.search|insecure|block] tables,
	// which containers/image refuses.
	V1 struct {
		Search   struct{ Registries []string } `toml:"search"`
		Insecure struct{ Registries []string } `toml:"insecure"`
		Block    struct{ Registries []string } `toml:"block"`
	} `toml:"registries"`
}

// maxRegistriesConfBytes bounds each file read: a registries.conf is a few
// kilobytes; a huge one is a mistake, not a configuration.
const maxRegistriesConfBytes = 4 << 20

// loadRegistriesConf reads path and the *.conf files of path+".d", as
// containers/image does for CRI-O: a missing file or directory is no
// configuration, not an error. The error names the file and what is wrong
// with it.
func loadRegistriesConf(path string) (*registriesConf, error) {
	fp, err := registriesConfFingerprint(path)
	if err != nil {
		return nil, err
	}
	rc := &registriesConf{fingerprint: fp}
	files, err := registriesConfFiles(path)
	if err != nil {
		return nil, err
	}
	byPrefix := map[string]confRegistry{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since the listing: the next fingerprint differs
		}
		if err != nil {
			return nil, fmt.Errorf("registries configuration: %w", err)
		}
		regs, err := parseRegistriesConf(b)
		if err != nil {
			return nil, fmt.Errorf("registries configuration %s: %w", f, err)
		}
		rc.files = append(rc.files, f)
		for _, r := range regs {
			r.file = f
			byPrefix[r.Prefix] = r
		}
	}
	for _, p := range slices.Sorted(maps.Keys(byPrefix)) {
		rc.registries = append(rc.registries, byPrefix[p])
	}
	return rc, nil
}

// registriesConfFiles lists the main file and the drop-ins, by name.
func registriesConfFiles(path string) ([]string, error) {
	files := []string{path}
	entries, err := os.ReadDir(path + ".d")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("registries configuration: %w", err)
	}
	for _, e := range entries { // os.ReadDir sorts by name
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") {
			files = append(files, filepath.Join(path+".d", e.Name()))
		}
	}
	return files, nil
}

// registriesConfFingerprint identifies the state of the files (names,
// sizes, modification times): a check reads them again when it changed.
func registriesConfFingerprint(path string) (string, error) {
	var b strings.Builder
	files, err := registriesConfFiles(path)
	if err != nil {
		return "", err
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(&b, "%s\x00-\x00", f)
		case err != nil:
			return "", fmt.Errorf("registries configuration: %w", err)
		default:
			fmt.Fprintf(&b, "%s\x00%d\x00%d\x00", f, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String(), nil
}

// parseRegistriesConf decodes one file and checks it as containers/image
// does (postProcessRegistries): the entries, normalized, with the first of
// a prefix named twice kept.
func parseRegistriesConf(b []byte) ([]confRegistry, error) {
	f, err := decodeRegistriesConf(b)
	if err != nil {
		return nil, err
	}
	for i := range f.Registries {
		if err := normalizeConfRegistry(i, &f.Registries[i]); err != nil {
			return nil, err
		}
	}
	if err := sameSettingsPerLocation(f.Registries); err != nil {
		return nil, err
	}
	// The first entry of a prefix wins: a later one is never matched.
	var out []confRegistry
	seen := map[string]bool{}
	for _, r := range f.Registries {
		if !seen[r.Prefix] {
			seen[r.Prefix] = true
			out = append(out, r)
		}
	}
	return out, nil
}

// decodeRegistriesConf decodes a file and checks what is not an entry:
// the format's version, the short-name mode, the search registries.
func decodeRegistriesConf(b []byte) (*confFile, error) {
	if len(b) > maxRegistriesConfBytes {
		return nil, fmt.Errorf("over %d bytes", maxRegistriesConfBytes)
	}
	var f confFile
	if err := toml.NewDecoder(bytes.NewReader(b)).Decode(&f); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			where := fmt.Sprintf("line %d, column %d", row, col)
			if k := de.Key(); len(k) > 0 {
				where += ", key " + strings.Join(k, ".")
			}
			return nil, fmt.Errorf("%s: %s", where, tomlKeys(err.Error()))
		}
		return nil, err
	}
	if f.V1.Search.Registries != nil || f.V1.Insecure.Registries != nil || f.V1.Block.Registries != nil {
		return nil, errors.New("the v1 format ([registries.search], [registries.insecure], [registries.block]), which containers/image no longer reads: write [[registry]] entries")
	}
	switch f.ShortNameMode {
	case "", "disabled", "enforcing", "permissive":
	default:
		return nil, fmt.Errorf("short-name-mode %q: want disabled, enforcing or permissive", f.ShortNameMode)
	}
	for _, s := range f.UnqualifiedSearchRegistries {
		h, err := trimLocation(s)
		if err == nil {
			_, err = normalizeRegistry(h)
		}
		if err != nil {
			return nil, fmt.Errorf("unqualified-search-registries: %w", err)
		}
	}
	return &f, nil
}

// normalizeConfRegistry checks the i-th [[registry]] entry and its
// mirrors, and trims their locations and prefix in place.
func normalizeConfRegistry(i int, r *confRegistry) error {
	what := fmt.Sprintf("[[registry]] %d", i+1)
	var err error
	if r.Location, err = trimLocation(r.Location); err != nil {
		return fmt.Errorf("%s: location: %w", what, err)
	}
	if r.Prefix == "" {
		if r.Location == "" {
			return fmt.Errorf("%s: neither prefix nor location is set", what)
		}
		r.Prefix = r.Location
	} else {
		if r.Prefix, err = trimLocation(r.Prefix); err != nil {
			return fmt.Errorf("%s: prefix: %w", what, err)
		}
		if !strings.HasPrefix(r.Prefix, "*.") && r.Location == "" {
			return fmt.Errorf("%s (prefix %q): location is not set, and the prefix is no wildcard (*.example.com)", what, r.Prefix)
		}
	}
	what = fmt.Sprintf("[[registry]] %d (prefix %q)", i+1, r.Prefix)
	if strings.HasPrefix(r.Prefix, "*.") && strings.ContainsAny(r.Prefix, "/@:") {
		return fmt.Errorf("%s: a wildcard prefix is *.example.com, with no port, path, tag or digest", what)
	}
	if r.PullFromMirror != "" {
		return fmt.Errorf("%s: pull-from-mirror is for a [[registry.mirror]], not the registry", what)
	}
	for j := range r.Mirrors {
		m := &r.Mirrors[j]
		if m.Location, err = trimLocation(m.Location); err != nil {
			return fmt.Errorf("%s: mirror %d: location: %w", what, j+1, err)
		}
		if m.Location == "" {
			return fmt.Errorf("%s: mirror %d: location is not set", what, j+1)
		}
		switch m.PullFromMirror {
		case "", "all", "digest-only", "tag-only":
		default:
			return fmt.Errorf("%s: mirror %d: pull-from-mirror %q: want all, digest-only or tag-only", what, j+1, m.PullFromMirror)
		}
		if r.MirrorByDigestOnly && m.PullFromMirror != "" {
			return fmt.Errorf("%s: mirror-by-digest-only and a mirror's pull-from-mirror are set together", what)
		}
	}
	return nil
}

// sameSettingsPerLocation: one location named by several entries
// (several prefixes) must say the same of it.
func sameSettingsPerLocation(regs []confRegistry) error {
	keyOf := func(r *confRegistry) string {
		if r.Location == "" {
			return r.Prefix
		}
		return r.Location
	}
	byLocation := map[string][]int{}
	for i := range regs {
		byLocation[keyOf(&regs[i])] = append(byLocation[keyOf(&regs[i])], i)
	}
	for i := range regs {
		r := &regs[i]
		key := keyOf(r)
		for _, j := range byLocation[key] {
			o := &regs[j]
			if o.Insecure != r.Insecure {
				return fmt.Errorf("registry %q is defined twice with conflicting insecure settings", key)
			}
			if o.Blocked != r.Blocked {
				return fmt.Errorf("registry %q is defined twice with conflicting blocked settings", key)
			}
		}
	}
	return nil
}

var goField = regexp.MustCompile(`struct field [\w.]*\.(\w+) of type`)

// tomlKeys is a decoder's message with the Go field it names as the key
// of the file: "cannot decode TOML string into key insecure of type bool".
func tomlKeys(msg string) string {
	return goField.ReplaceAllStringFunc(msg, func(m string) string {
		name := goField.FindStringSubmatch(m)[1]
		for _, t := range []reflect.Type{reflect.TypeFor[confFile](), reflect.TypeFor[confRegistry](), reflect.TypeFor[confEndpoint]()} {
			if f, ok := t.FieldByName(name); ok {
				if key, _, _ := strings.Cut(f.Tag.Get("toml"), ","); key != "" {
					name = key
				}
				break
			}
		}
		return "key " + name + " of type"
	})
}

// trimLocation is a prefix or location as containers/image keeps it: no
// trailing slash, and no URL scheme (it takes none).
func trimLocation(s string) (string, error) {
	t := strings.TrimRight(s, "/")
	if strings.HasPrefix(t, "http://") || strings.HasPrefix(t, "https://") {
		return "", fmt.Errorf("%q: a location takes no URL scheme (insecure = true allows http)", s)
	}
	return t, nil
}

// prefixMatch is the length of ref that prefix matches, or -1. ref is a
// repository name with its registry ("docker.io/library/nginx"). As
// containers/image: a prefix matches at a boundary (the end, or ':', '/',
// '@' after it), and "*.example.com" matches any host under example.com.
func prefixMatch(ref, prefix string) int {
	if rest, ok := strings.CutPrefix(prefix, "*"); ok {
		i := strings.Index(ref, rest)
		if i == -1 || strings.Contains(ref[:i], "/") {
			return -1
		}
		i += len(rest)
		if i == len(ref) || strings.ContainsRune(":/@", rune(ref[i])) {
			return i
		}
		return -1
	}
	if !strings.HasPrefix(ref, prefix) {
		return -1
	}
	if len(ref) == len(prefix) || strings.ContainsRune(":/@", rune(ref[len(prefix)])) {
		return len(prefix)
	}
	return -1
}

// find is the entry ref matches: the longest prefix (a wildcard's counted
// with its "*"), the first in prefix order among equals; nil for none.
func (rc *registriesConf) find(ref string) *confRegistry {
	var best *confRegistry
	for i := range rc.registries {
		r := &rc.registries[i]
		if prefixMatch(ref, r.Prefix) != -1 && (best == nil || len(r.Prefix) > len(best.Prefix)) {
			best = r
		}
	}
	return best
}

// rewrite is ref at e's location (containers/image's rewriteReference): the
// location replaces what the prefix matched. A wildcard entry's own
// location is empty: ref is where it is.
func (r *confRegistry) rewrite(ref string, e confEndpoint) (domain, path string, err error) {
	n := prefixMatch(ref, r.Prefix)
	if n == -1 {
		return "", "", fmt.Errorf("prefix %q does not match %s", r.Prefix, ref)
	}
	s := ref
	if e.Location != "" {
		s = e.Location + ref[n:]
	}
	named, err := reference.ParseNamed(s)
	if err != nil {
		return "", "", fmt.Errorf("%s rewritten by prefix %q to location %q is %q, no repository name: %v", ref, r.Prefix, e.Location, s, err)
	}
	return reference.Domain(named), reference.Path(named), nil
}

// locationHost is the host[:port] of a location ("" for none).
func locationHost(location string) string {
	h, _, _ := strings.Cut(location, "/")
	return h
}
