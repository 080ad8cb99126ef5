package credplugins

import (
	"context"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// dockerConfigRunner answers a provider's requests from a DockerConfig in
// process, as the reference plugin would by exec.
type dockerConfigRunner struct{ cfg *keyring.DockerConfig }

func (r dockerConfigRunner) Run(_ context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
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
	d, err := keyring.ReadDockerConfig(path)
	if err != nil {
		return nil, err
	}
	p := Provider{Name: "docker-config", File: path, MatchImages: d.MatchImages(), APIVersion: "credentialprovider.kubelet.k8s.io/v1"}
	in, err := New(&Config{Providers: []Provider{p}}, opts)
	if err != nil {
		return nil, err
	}
	in.plugins()[0].Runner = dockerConfigRunner{d}
	return in, nil
}
