package imageref

import (
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/distribution/reference"
)

var (
	idPattern       = regexp.MustCompile(`^(sha256:)?[a-f0-9]{64}$`)
	idPrefixPattern = regexp.MustCompile(`^(sha256:)?[a-f0-9]{1,64}$`)
)

// IsID reports whether s is a full image ID, with or without "sha256:".
func IsID(s string) bool { return idPattern.MatchString(s) }

// MayBeIDPrefix reports whether containerd may take s for (a prefix of) an
// image ID when no image has that name.
func MayBeIDPrefix(s string) bool { return idPrefixPattern.MatchString(s) }

// NamesNoImage reports whether no image can be given by s: it is no
// reference, no image ID and no ID prefix. containerd resolves such a
// string to nothing (1.6 answers it with Unknown, not NotFound): whatever
// its code, the runtime's answer can only be "no such image".
func NamesNoImage(s string) bool {
	// "" is a prefix of every ID: containerd resolves it to the only image
	// of a node that has one.
	return s != "" && !MayBeIDPrefix(s) && !Parse(s).OK
}

// Name is what a string names, parsed.
type Name struct {
	Repository string // normalized, no tag or digest: "docker.io/library/nginx"
	Ref        string // fully normalized, the default tag added when there is no tag or digest
	OK         bool   // false for an image ID or what does not parse
}

// Lookup is the name as the runtime lists and resolves it: Ref, except
// that a name with both a tag and a digest is its repository and digest
// (containerd's ParseDockerRef drops the tag: the digest decides). "" for
// no name.
func (n Name) Lookup() string {
	if i := strings.IndexByte(n.Ref, '@'); i >= 0 {
		return n.Repository + n.Ref[i:]
	}
	return n.Ref
}

// Digest is the manifest digest the name pins ("sha256:..."), "" when it
// pins none: how a runtime's repo digest (repo@sha256:...) says which
// manifest it fetched for the repository. Parsed by the reference grammar,
// so one spelling serves every caller.
func (n Name) Digest() string {
	if i := strings.IndexByte(n.Ref, '@'); i >= 0 {
		return n.Ref[i+1:]
	}
	return ""
}

// maxReferenceLength is more than any reference can be: a repository of
// at most 255 bytes (reference.NameTotalLengthMax), a tag of at most 128
// and a digest. A longer string is refused before the grammar runs, which
// costs seconds on a string of megabytes.
const maxReferenceLength = 1024

// Parse parses s. An image ID is no name.
func Parse(s string) Name {
	if len(s) > maxReferenceLength || IsID(s) {
		return Name{}
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Name{}
	}
	return Name{Repository: named.Name(), Ref: reference.TagNameOnly(named).String(), OK: true}
}

// Repository returns the normalized repository of a reference, and false
// for an image ID or what does not parse.
func Repository(s string) (string, bool) {
	n := Parse(s)
	return n.Repository, n.OK
}

// Normalized returns the full normalized form of a reference, and false
// for an image ID or what does not parse.
func Normalized(s string) (string, bool) {
	n := Parse(s)
	return n.Ref, n.OK
}

// Names remembers parses; the zero value is ready. Only names a reference
// can have are remembered (a socket client may send any string, up to the
// 16 MiB message limit): what does not parse is parsed again each time.
// Past its bounds, in entries and in bytes, it forgets everything and
// starts again: the names a node uses are few.
type Names struct {
	m     sync.Map // string -> Name
	len   atomic.Int64
	bytes atomic.Int64
}

// The bounds of a Names. A reference is at most 255 bytes of repository,
// a 128-byte tag and a digest, so the entries bound the bytes too; the
// byte bound keeps the worst case to a few MiB.
const (
	maxRemembered      = 8192
	maxRememberedBytes = 4 << 20
)

// Parse is Parse, remembered.
func (c *Names) Parse(s string) Name {
	if v, ok := c.m.Load(s); ok {
		return v.(Name)
	}
	n := Parse(s)
	if !n.OK {
		return n
	}
	size := int64(len(s) + len(n.Ref) + len(n.Repository))
	if c.len.Add(1) > maxRemembered || c.bytes.Add(size) > maxRememberedBytes {
		c.m.Clear()
		c.len.Store(1)
		c.bytes.Store(size)
	}
	c.m.Store(s, n)
	return n
}

// CanonicalID is an image ID in the one form the proxy keeps and compares:
// "sha256:" and 64 hex digits. containerd answers IDs in that form, CRI-O
// as bare hex (the same digest): a bare 64-hex ID gains its "sha256:".
// Anything else (a name, a prefix) is returned as it is.
func CanonicalID(id string) string {
	if len(id) == 64 && IsID(id) {
		return "sha256:" + id
	}
	return id
}

// BareID is a full image ID without its "sha256:", as CRI-O writes it;
// anything else is returned as it is.
func BareID(id string) string {
	if IsID(id) {
		return strings.TrimPrefix(id, "sha256:")
	}
	return id
}
