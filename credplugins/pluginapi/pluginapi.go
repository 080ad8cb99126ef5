package pluginapi

import (
	"errors"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	"k8s.io/kubelet/pkg/apis/credentialprovider/install"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
	credentialproviderv1alpha1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1alpha1"
	credentialproviderv1beta1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1beta1"
)

// The one codec of the plugin API, with the official types and conversions
// of k8s.io/kubelet, as the kubelet has.
var (
	codecs = func() serializer.CodecFactory {
		s := runtime.NewScheme()
		install.Install(s)
		return serializer.NewCodecFactory(s, serializer.EnableStrict)
	}()

	apiVersions = map[string]schema.GroupVersion{
		credentialproviderv1.SchemeGroupVersion.String():       credentialproviderv1.SchemeGroupVersion,
		credentialproviderv1beta1.SchemeGroupVersion.String():  credentialproviderv1beta1.SchemeGroupVersion,
		credentialproviderv1alpha1.SchemeGroupVersion.String(): credentialproviderv1alpha1.SchemeGroupVersion,
	}
)

// SupportedAPIVersions lists the plugin API versions, sorted.
func SupportedAPIVersions() []string {
	out := make([]string, 0, len(apiVersions))
	for v := range apiVersions {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// Supported reports whether apiVersion is a plugin API version.
func Supported(apiVersion string) bool {
	_, ok := apiVersions[apiVersion]
	return ok
}

// EncodeRequest encodes req in apiVersion: the proxy's side.
func EncodeRequest(apiVersion string, req *credentialproviderapi.CredentialProviderRequest) ([]byte, error) {
	gv, ok := apiVersions[apiVersion]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q is not supported", apiVersion)
	}
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, errors.New("no JSON serializer")
	}
	return runtime.Encode(codecs.EncoderForVersion(info.Serializer, gv), req)
}

// ErrInvalidResponse marks a plugin answer that is not a valid
// CredentialProviderResponse; its message never quotes the answer, which
// may hold credentials.
var ErrInvalidResponse = errors.New("invalid credential provider response")

// DecodeResponse decodes and validates a plugin's stdout: apiVersion equal
// to the request's, kind CredentialProviderResponse, strict fields, and a
// cacheKeyType of Image, Registry or Global.
func DecodeResponse(apiVersion string, data []byte) (*credentialproviderapi.CredentialProviderResponse, error) {
	gvk, err := json.DefaultMetaFactory.Interpret(data)
	if err != nil {
		// The JSON error may quote the response: say only what is wrong.
		return nil, fmt.Errorf("%w: not a JSON object with apiVersion and kind", ErrInvalidResponse)
	}
	if got := gvk.GroupVersion().String(); got != apiVersion {
		return nil, fmt.Errorf("%w: apiVersion is %q, want %q (the request's)", ErrInvalidResponse, got, apiVersion)
	}
	if gvk.Kind != "CredentialProviderResponse" {
		return nil, fmt.Errorf("%w: kind is %q, want CredentialProviderResponse", ErrInvalidResponse, gvk.Kind)
	}
	obj, _, err := codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		// Not wrapped: decoding errors may quote credentials.
		return nil, fmt.Errorf("%w: it does not decode strictly as %s CredentialProviderResponse (unknown field or wrong type)", ErrInvalidResponse, apiVersion)
	}
	resp, ok := obj.(*credentialproviderapi.CredentialProviderResponse)
	if !ok {
		return nil, fmt.Errorf("%w: decoded to %T", ErrInvalidResponse, obj)
	}
	switch resp.CacheKeyType {
	case credentialproviderapi.ImagePluginCacheKeyType, credentialproviderapi.RegistryPluginCacheKeyType, credentialproviderapi.GlobalPluginCacheKeyType:
	default:
		return nil, fmt.Errorf("%w: cacheKeyType is %q, want Image, Registry or Global", ErrInvalidResponse, resp.CacheKeyType)
	}
	if resp.CacheDuration != nil && resp.CacheDuration.Duration < 0 {
		return nil, fmt.Errorf("%w: cacheDuration %v is negative", ErrInvalidResponse, resp.CacheDuration.Duration)
	}
	return resp, nil
}

// DecodeRequest decodes a request in any plugin API version strictly into
// the internal type, and returns its version: the plugin's side.
func DecodeRequest(data []byte) (*credentialproviderapi.CredentialProviderRequest, schema.GroupVersion, error) {
	obj, gvk, err := codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, schema.GroupVersion{}, fmt.Errorf("decode request: %w", err)
	}
	req, ok := obj.(*credentialproviderapi.CredentialProviderRequest)
	if !ok {
		return nil, schema.GroupVersion{}, fmt.Errorf("decode request: got %s, want CredentialProviderRequest", gvk.Kind)
	}
	return req, gvk.GroupVersion(), nil
}

// EncodeResponse encodes resp in version gv (the request's): the plugin's
// side. Its error never quotes the response, which holds credentials.
func EncodeResponse(gv schema.GroupVersion, resp *credentialproviderapi.CredentialProviderResponse) ([]byte, error) {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, errors.New("no JSON serializer")
	}
	b, err := runtime.Encode(codecs.EncoderForVersion(info.Serializer, gv), resp)
	if err != nil {
		return nil, errors.New("encode response failed") // not wrapped: it could quote the credentials
	}
	return b, nil
}
