package main

import (
	"errors"
	"fmt"
	"io"

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
	cfg, err := credplugins.ReadDockerConfig(configPath)
	if err != nil {
		return err
	}
	found, keyType := cfg.Lookup(req.Image)
	auth := make(map[string]credentialproviderapi.AuthConfig, len(found))
	for k, c := range found {
		auth[k] = credentialproviderapi.AuthConfig{Username: c.Username, Password: c.Password}
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
