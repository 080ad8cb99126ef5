package credplugins

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
)

// DockerConfig is the "auths" of a docker config.json: registry keys (as
// the kubelet's keyring reads them) and their credentials.
type DockerConfig struct {
	path  string
	auths Auth
}

// ReadDockerConfig reads a docker config.json. Errors name the file and
// the entry, never quote its content (it holds passwords).
func ReadDockerConfig(path string) (*DockerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	var raw struct {
		Auths map[string]struct {
			Username string `json:"username"`
			Password string `json:"password"`
			Auth     string `json:"auth"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("docker config %s: not valid JSON", path)
	}
	d := &DockerConfig{path: path, auths: Auth{}}
	for k, e := range raw.Auths {
		key, ok := AuthKey(k)
		if !ok {
			continue
		}
		user, pass := e.Username, e.Password
		if e.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, fmt.Errorf("docker config %s: auths[%q].auth is not base64", path, k)
			}
			var found bool
			if user, pass, found = strings.Cut(string(dec), ":"); !found {
				return nil, fmt.Errorf("docker config %s: auths[%q].auth is not base64 of user:password", path, k)
			}
		}
		d.auths[key] = Credential{Username: user, Password: pass}
	}
	return d, nil
}

// Keys returns the registry keys of the file, sorted.
func (d *DockerConfig) Keys() []string {
	keys := make([]string, 0, len(d.auths))
	for k := range d.auths {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Lookup returns the entries that match image (a repository without tag or
// digest), and the cache key type a plugin answering them would give:
// Registry, or Image when a matching key has a path.
func (d *DockerConfig) Lookup(image string) (Auth, credentialproviderapi.PluginCacheKeyType) {
	auth := Auth{}
	keyType := credentialproviderapi.RegistryPluginCacheKeyType
	for key, c := range d.auths {
		if !MatchImage(key, image) {
			continue
		}
		auth[key] = c
		if strings.Contains(key, "/") {
			keyType = credentialproviderapi.ImagePluginCacheKeyType // a path: the answer depends on the image
		}
	}
	return auth, keyType
}

// dockerConfigRunner answers a provider's requests from a DockerConfig in
// process, as the reference plugin would by exec.
type dockerConfigRunner struct{ cfg *DockerConfig }

func (r dockerConfigRunner) run(_ context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
	auth, keyType := r.cfg.Lookup(req.Image)
	resp := &credentialproviderapi.CredentialProviderResponse{CacheKeyType: keyType, Auth: map[string]credentialproviderapi.AuthConfig{}}
	for k, c := range auth {
		resp.Auth[k] = credentialproviderapi.AuthConfig{Username: c.Username, Password: c.Password}
	}
	return resp, nil, nil
}

// NewFromDockerConfig returns an Injector whose one provider, named
// "docker-config", answers from the docker config.json at path for the
// registries it lists, without a plugin executable: for tools (bake) that
// take a config.json where the node has plugins. Nothing is cached.
func NewFromDockerConfig(path string, opts Options) (*Injector, error) {
	d, err := ReadDockerConfig(path)
	if err != nil {
		return nil, err
	}
	p := Provider{Name: "docker-config", File: path, MatchImages: d.Keys(), APIVersion: "credentialprovider.kubelet.k8s.io/v1"}
	in, err := New(&Config{Providers: []Provider{p}}, opts)
	if err != nil {
		return nil, err
	}
	in.plugins[0].runner = dockerConfigRunner{d}
	return in, nil
}
