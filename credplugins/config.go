package credplugins

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubeletconfigv1 "k8s.io/kubelet/config/v1"
	kubeletconfigv1alpha1 "k8s.io/kubelet/config/v1alpha1"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"

	"github.com/cri-image-proxy/cri-image-proxy/credplugins/pluginapi"
	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
)

// Config is a loaded, validated CredentialProviderConfig.
type Config struct {
	// Providers in the order the kubelet uses them: files in lexicographic
	// order, providers in file order.
	Providers []Provider
	// BinDir holds the plugin executables.
	BinDir string
	// Hash identifies the configuration's content ("sha256:..."), as the
	// kubelet's credential_provider_config_info metric does.
	Hash string
}

// Provider is one configured exec plugin, whatever the apiVersion of the
// file that declared it.
type Provider struct {
	Name                 string
	MatchImages          []string
	DefaultCacheDuration time.Duration
	// APIVersion is the version of the request and response,
	// credentialprovider.kubelet.k8s.io/{v1,v1beta1,v1alpha1}.
	APIVersion      string
	Args            []string
	Env             []EnvVar
	TokenAttributes *TokenAttributes // only in kubelet.config.k8s.io/v1 files

	// File is where the provider was declared, for messages.
	File string

	hasDefaultCacheDuration bool // defaultCacheDuration is required, even as 0
}

// EnvVar is an environment variable for the plugin.
type EnvVar = execplugin.EnvVar

// TokenAttributes configure service-account tokens for the plugin (KEP-4412).
type TokenAttributes struct {
	ServiceAccountTokenAudience          string
	CacheType                            string // Token or ServiceAccount
	RequireServiceAccount                *bool  // required
	RequiredServiceAccountAnnotationKeys []string
	OptionalServiceAccountAnnotationKeys []string
}

// configCodecs decodes the three versions of the kubelet's
// CredentialProviderConfig strictly: an unknown or misspelt field, or
// tokenAttributes in a version that has none, is an error.
var configCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{kubeletconfigv1.AddToScheme, kubeletconfigv1beta1.AddToScheme, kubeletconfigv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// LoadConfig reads a CredentialProviderConfig from a file, or from every
// *.json, *.yaml and *.yml file of a directory in lexicographic order, as
// the kubelet's --image-credential-provider-config does, and validates it
// against binDir. Every error names the file, the provider and the field.
func LoadConfig(path, binDir string) (*Config, error) {
	cfg := &Config{BinDir: binDir}
	hash, err := execplugin.LoadConfig(kind.Config, path, func(f *execplugin.ConfigFile) {
		providers, err := decodeConfig(f.Data)
		if err != nil {
			f.Fail(err)
			return
		}
		if len(providers) == 0 {
			f.Fail(field.Required(field.NewPath("providers"), "at least 1 provider is required"))
		}
		for i := range providers {
			p := &providers[i]
			p.File = f.Path
			path := field.NewPath("providers").Index(i)
			f.FailProvider(p.Name, validateProvider(path, p, binDir))
			f.Declare(path.Child("name"), p.Name)
			cfg.Providers = append(cfg.Providers, *p)
		}
	})
	if err != nil {
		return nil, err
	}
	cfg.Hash = hash
	return cfg, nil
}

// decodeConfig decodes one file of any supported version. Each version is
// decoded strictly into its own type (so a field of a newer version, such as
// tokenAttributes in v1beta1, is an error); v1alpha1 and v1beta1, whose
// fields are a subset of v1's with the same names, are then read as v1.
func decodeConfig(data []byte) ([]Provider, error) {
	obj, gvk, err := configCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	var c kubeletconfigv1.CredentialProviderConfig
	switch obj := obj.(type) {
	case *kubeletconfigv1.CredentialProviderConfig:
		c = *obj
	case *kubeletconfigv1beta1.CredentialProviderConfig, *kubeletconfigv1alpha1.CredentialProviderConfig:
		b, err := json.Marshal(obj)
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s as %s: %w", gvk.GroupVersion(), kubeletconfigv1.SchemeGroupVersion, err)
		}
	default:
		return nil, fmt.Errorf("kind %q of %q is not a CredentialProviderConfig", gvk.Kind, gvk.GroupVersion())
	}
	out := make([]Provider, 0, len(c.Providers))
	for _, p := range c.Providers {
		q := Provider{Name: p.Name, MatchImages: p.MatchImages, APIVersion: p.APIVersion, Args: p.Args}
		if p.DefaultCacheDuration != nil {
			q.DefaultCacheDuration, q.hasDefaultCacheDuration = p.DefaultCacheDuration.Duration, true
		}
		for _, e := range p.Env {
			q.Env = append(q.Env, EnvVar{Name: e.Name, Value: e.Value})
		}
		if t := p.TokenAttributes; t != nil {
			q.TokenAttributes = &TokenAttributes{
				ServiceAccountTokenAudience:          t.ServiceAccountTokenAudience,
				CacheType:                            string(t.CacheType),
				RequireServiceAccount:                t.RequireServiceAccount,
				RequiredServiceAccountAnnotationKeys: t.RequiredServiceAccountAnnotationKeys,
				OptionalServiceAccountAnnotationKeys: t.OptionalServiceAccountAnnotationKeys,
			}
		}
		out = append(out, q)
	}
	return out, nil
}

// validateProvider applies the kubelet's rules
// (pkg/credentialprovider/plugin/config.go), those every kind's entry
// follows (execplugin.ValidateEntry: the name, an executable in binDir,
// the apiVersion, matchImages, env) and a credential provider's own.
func validateProvider(p *field.Path, pr *Provider, binDir string) field.ErrorList {
	errs := execplugin.ValidateEntry(p, pr.entry(), binDir, pluginapi.SupportedAPIVersions())
	// Required even as 0, with the kubelet's words: a credential provider
	// has no default duration, unlike an image policy provider.
	switch {
	case !pr.hasDefaultCacheDuration:
		errs = append(errs, field.Required(p.Child("defaultCacheDuration"), "how long to cache credentials when the plugin does not say"))
	case pr.DefaultCacheDuration < 0:
		errs = append(errs, field.Invalid(p.Child("defaultCacheDuration"), pr.DefaultCacheDuration.String(), "defaultCacheDuration must be greater than or equal to 0"))
	}
	if t := pr.TokenAttributes; t != nil {
		errs = append(errs, validateTokenAttributes(p.Child("tokenAttributes"), pr.APIVersion, t)...)
	}
	return errs
}

// entry is what the provider says of its plugin, as every kind's says it.
func (pr *Provider) entry() execplugin.Entry {
	return execplugin.Entry{Name: pr.Name, APIVersion: pr.APIVersion, MatchImages: pr.MatchImages, Args: pr.Args, Env: pr.Env}
}

// validateTokenAttributes applies the kubelet's rules for KEP-4412.
func validateTokenAttributes(p *field.Path, apiVersion string, t *TokenAttributes) field.ErrorList {
	var errs field.ErrorList
	if t.ServiceAccountTokenAudience == "" {
		errs = append(errs, field.Required(p.Child("serviceAccountTokenAudience"), ""))
	}
	if apiVersion != credentialproviderv1.SchemeGroupVersion.String() {
		errs = append(errs, field.Forbidden(p, "tokenAttributes is only supported for "+credentialproviderv1.SchemeGroupVersion.String()+" API version"))
	}
	if t.RequireServiceAccount == nil {
		errs = append(errs, field.Required(p.Child("requireServiceAccount"), ""))
	} else if !*t.RequireServiceAccount && len(t.RequiredServiceAccountAnnotationKeys) > 0 {
		errs = append(errs, field.Forbidden(p.Child("requiredServiceAccountAnnotationKeys"), "requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"))
	}
	errs = append(errs, validateAnnotationKeys(p.Child("requiredServiceAccountAnnotationKeys"), t.RequiredServiceAccountAnnotationKeys)...)
	errs = append(errs, validateAnnotationKeys(p.Child("optionalServiceAccountAnnotationKeys"), t.OptionalServiceAccountAnnotationKeys)...)
	if both := sets.New(t.RequiredServiceAccountAnnotationKeys...).Intersection(sets.New(t.OptionalServiceAccountAnnotationKeys...)); both.Len() > 0 {
		errs = append(errs, field.Invalid(p, sets.List(both), "annotation keys cannot be both required and optional"))
	}
	switch t.CacheType {
	case "":
		errs = append(errs, field.Required(p.Child("cacheType"), "cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token"))
	case "Token", "ServiceAccount":
	default:
		errs = append(errs, field.NotSupported(p.Child("cacheType"), t.CacheType, []string{"ServiceAccount", "Token"}))
	}
	return errs
}

func validateAnnotationKeys(p *field.Path, keys []string) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, k := range keys {
		// Annotation keys are qualified names, case-insensitively.
		for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
			errs = append(errs, field.Invalid(p.Index(i), k, msg))
		}
		if seen.Has(k) {
			errs = append(errs, field.Duplicate(p.Index(i), k))
		}
		seen.Insert(k)
	}
	return errs
}
