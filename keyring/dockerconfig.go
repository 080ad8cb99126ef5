package keyring

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
)

// Credential is one username and password.
type Credential struct {
	Username, Password string
}

// Auth maps match keys (registry patterns) to credentials, as a plugin's
// answer and a docker config's "auths" do.
type Auth map[string]Credential

// DockerConfig is the registry credentials of a docker config.json
// ("auths"), or of a legacy .dockercfg: registry keys, as the kubelet's
// keyring reads them, and their credentials, each entry kept (two
// spellings of one registry are two entries).
type DockerConfig struct {
	entries []dockerEntry
}

type dockerEntry struct {
	key  string // normalized by AuthKey
	cred Credential
}

// dockerAuth is one entry as the files write it.
type dockerAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
	Auth     string `json:"auth"`
}

// ReadDockerConfig reads a docker config.json. Errors name the file and
// the entry, never quote its content (it holds passwords).
func ReadDockerConfig(path string) (*DockerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	d, err := ParseDockerConfig(data)
	if err != nil {
		return nil, fmt.Errorf("docker config %s: %w", path, err)
	}
	return d, nil
}

// ParseDockerConfig parses the content of a docker config.json (a
// kubernetes.io/dockerconfigjson secret's .dockerconfigjson).
func ParseDockerConfig(data []byte) (*DockerConfig, error) {
	var raw struct {
		Auths map[string]dockerAuth `json:"auths"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		// Not wrapped: a JSON error can quote the content, credentials included.
		return nil, errors.New("not valid JSON")
	}
	return newDockerConfig(raw.Auths)
}

// ParseDockercfg parses a legacy .dockercfg (a kubernetes.io/dockercfg
// secret's content): the auths map itself.
func ParseDockercfg(data []byte) (*DockerConfig, error) {
	var auths map[string]dockerAuth
	if err := json.Unmarshal(data, &auths); err != nil {
		return nil, errors.New("not valid JSON")
	}
	return newDockerConfig(auths)
}

func newDockerConfig(auths map[string]dockerAuth) (*DockerConfig, error) {
	d := &DockerConfig{}
	for k, e := range auths {
		key, ok := AuthKey(k)
		if !ok {
			continue
		}
		user, pass := e.Username, e.Password
		if e.Auth != "" {
			// As the kubelet: "auth" is base64 of user:password and wins.
			dec, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("auths[%q].auth is not base64", k)
			}
			var found bool
			if user, pass, found = strings.Cut(string(dec), ":"); !found {
				return nil, fmt.Errorf("auths[%q].auth is not base64 of user:password", k)
			}
		}
		d.entries = append(d.entries, dockerEntry{key, Credential{Username: user, Password: pass}})
	}
	return d, nil
}

// Credentials returns the credentials of the entries that serve image (a
// repository without tag or digest), as the kubelet's keyring picks them
// (Serving): the keys that match it, else Docker Hub's key for a Docker
// Hub image.
func (d *DockerConfig) Credentials(image string) []Credential {
	var out []Credential
	for _, e := range d.serving(image) {
		out = append(out, e.cred)
	}
	return out
}

// serving returns the entries that serve image (Serving).
func (d *DockerConfig) serving(image string) []dockerEntry {
	return Serving(image, d.entries, func(e dockerEntry) string { return e.key })
}

// MatchImages returns the patterns of the images the file holds
// credentials for, sorted: a provider answering from it runs for these
// (matchImages). They are its keys, and DockerHubPattern where it has
// Docker Hub's key, which serves Docker Hub images (Serving) without
// matching them.
func (d *DockerConfig) MatchImages() []string {
	keys := make([]string, 0, len(d.entries)+1)
	for _, e := range d.entries {
		keys = append(keys, e.key)
		if e.key == DockerHubKey {
			keys = append(keys, DockerHubPattern)
		}
	}
	sort.Strings(keys)
	return slices.Compact(keys)
}

// Lookup returns the entries that serve image (a repository without tag or
// digest; Serving), and the cache key type a plugin answering them gives:
// Registry only when no key of the file is narrower than the image's
// registry, else Image. A Registry answer serves "future images with the
// same registry hostname" without a run (KEP-2133): with registry.test and
// registry.test/team-a in the file, a Registry answer for
// registry.test/team-b/app would hand registry.test/team-a/app
// registry.test's credential, never its own, until it expired.
func (d *DockerConfig) Lookup(image string) (Auth, credentialproviderapi.PluginCacheKeyType) {
	auth := Auth{}
	for _, e := range d.serving(image) {
		auth[e.key] = e.cred
	}
	registry, _, _ := strings.Cut(image, "/")
	if d.hasKeyNarrowerThan(registry) {
		return auth, credentialproviderapi.ImagePluginCacheKeyType
	}
	return auth, credentialproviderapi.RegistryPluginCacheKeyType
}

// hasKeyNarrowerThan reports whether a key of the file has a path on a host
// that matches registry (host[:port]): the images of that path get another
// answer than the rest of the registry.
func (d *DockerConfig) hasKeyNarrowerThan(registry string) bool {
	for _, e := range d.entries {
		if host, path, found := strings.Cut(e.key, "/"); found && path != "" && MatchImage(host, registry) {
			return true
		}
	}
	return false
}
