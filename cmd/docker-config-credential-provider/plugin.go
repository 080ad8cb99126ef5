package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	"k8s.io/kubelet/pkg/apis/credentialprovider/install"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins"
)

var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	install.Install(s)
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// dockerConfig is the part of config.json the plugin reads.
type dockerConfig struct {
	Auths map[string]struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Auth     string `json:"auth"`
	} `json:"auths"`
}

// run answers one request read from in, on out.
func run(in io.Reader, out io.Writer, configPath string) error {
	data, err := io.ReadAll(io.LimitReader(in, 1<<20))
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	obj, gvk, err := codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return fmt.Errorf("decode request: %w", err)
	}
	req, ok := obj.(*credentialproviderapi.CredentialProviderRequest)
	if !ok {
		return fmt.Errorf("decode request: got %s, want CredentialProviderRequest", gvk.Kind)
	}
	if req.Image == "" {
		return errors.New("the request names no image")
	}
	auth, keyType, err := lookup(configPath, req.Image)
	if err != nil {
		return err
	}
	resp := &credentialproviderapi.CredentialProviderResponse{CacheKeyType: keyType, Auth: auth}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	b, err := runtime.Encode(codecs.EncoderForVersion(info.Serializer, gvk.GroupVersion()), resp)
	if err != nil {
		// Not wrapped: the error could quote the credentials.
		return errors.New("encode response failed")
	}
	_, err = out.Write(b)
	return err
}

// lookup returns the entries of the config file that match image.
func lookup(path, image string) (map[string]credentialproviderapi.AuthConfig, credentialproviderapi.PluginCacheKeyType, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("docker config: %w", err)
	}
	var cfg dockerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		// Not wrapped: a JSON error can quote the file, credentials included.
		return nil, "", fmt.Errorf("docker config %s: not valid JSON", path)
	}
	auth := map[string]credentialproviderapi.AuthConfig{}
	keyType := credentialproviderapi.RegistryPluginCacheKeyType
	for raw, e := range cfg.Auths {
		key, ok := credplugins.AuthKey(raw)
		if !ok || !credplugins.MatchImage(key, image) {
			continue
		}
		user, pass := e.Username, e.Password
		if e.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(e.Auth)
			if err != nil {
				return nil, "", fmt.Errorf("docker config %s: auths[%q].auth is not base64", path, raw)
			}
			var found bool
			if user, pass, found = strings.Cut(string(dec), ":"); !found {
				return nil, "", fmt.Errorf("docker config %s: auths[%q].auth is not base64 of user:password", path, raw)
			}
		}
		auth[key] = credentialproviderapi.AuthConfig{Username: user, Password: pass}
		if strings.Contains(key, "/") {
			keyType = credentialproviderapi.ImagePluginCacheKeyType // a path: the answer depends on the image
		}
	}
	return auth, keyType, nil
}
