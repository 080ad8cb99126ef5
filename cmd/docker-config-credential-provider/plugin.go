package main

import (
	"errors"
	"fmt"
	"io"

	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// run answers one request read from in, on out.
func run(in io.Reader, out io.Writer, configPath string) error {
	data, err := io.ReadAll(io.LimitReader(in, 1<<20))
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	req, version, err := pluginapi.DecodeRequest(data)
	if err != nil {
		return err
	}
	if req.Image == "" {
		return errors.New("the request names no image")
	}
	cfg, err := keyring.ReadDockerConfig(configPath)
	if err != nil {
		return err
	}
	found, keyType := cfg.Lookup(req.Image)
	auth := make(map[string]credentialproviderapi.AuthConfig, len(found))
	for k, c := range found {
		auth[k] = credentialproviderapi.AuthConfig{Username: c.Username, Password: c.Password}
	}
	resp := &credentialproviderapi.CredentialProviderResponse{CacheKeyType: keyType, Auth: auth}
	b, err := pluginapi.EncodeResponse(version, resp)
	if err != nil {
		return err
	}
	_, err = out.Write(b)
	return err
}
