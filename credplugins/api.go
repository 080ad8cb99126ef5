package credplugins

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

// The plugin API: requests are encoded in the provider's apiVersion and
// responses decoded strictly into the internal type, with the official
// types and conversions of k8s.io/kubelet, as the kubelet does.
var (
	pluginScheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		install.Install(s)
		return s
	}()
	pluginCodecs = serializer.NewCodecFactory(pluginScheme, serializer.EnableStrict)

	apiVersions = map[string]schema.GroupVersion{
		credentialproviderv1.SchemeGroupVersion.String():       credentialproviderv1.SchemeGroupVersion,
		credentialproviderv1beta1.SchemeGroupVersion.String():  credentialproviderv1beta1.SchemeGroupVersion,
		credentialproviderv1alpha1.SchemeGroupVersion.String(): credentialproviderv1alpha1.SchemeGroupVersion,
	}
)

func supportedAPIVersions() []string {
	out := make([]string, 0, len(apiVersions))
	for v := range apiVersions {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// encodeRequest encodes req in apiVersion.
func encodeRequest(apiVersion string, req *credentialproviderapi.CredentialProviderRequest) ([]byte, error) {
	gv, ok := apiVersions[apiVersion]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q is not supported", apiVersion)
	}
	info, ok := runtime.SerializerInfoForMediaType(pluginCodecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, errors.New("no JSON serializer")
	}
	return runtime.Encode(pluginCodecs.EncoderForVersion(info.Serializer, gv), req)
}

// ErrInvalidResponse marks a plugin answer that is not a valid
// CredentialProviderResponse; its message never quotes the answer, which
// may hold credentials.
var ErrInvalidResponse = errors.New("invalid credential provider response")

// decodeResponse decodes and validates a plugin's stdout: apiVersion equal
// to the request's, kind CredentialProviderResponse, strict fields, and a
// cacheKeyType of Image, Registry or Global.
func decodeResponse(apiVersion string, data []byte) (*credentialproviderapi.CredentialProviderResponse, error) {
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
	obj, _, err := pluginCodecs.UniversalDecoder().Decode(data, nil, nil)
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
