package credplugins

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/cryptobyte"
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
	"github.com/cri-image-proxy/cri-image-proxy/internal/configfiles"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
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
type EnvVar struct{ Name, Value string }

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
	files, err := configFiles(path)
	if err != nil {
		return nil, err
	}
	cfg := &Config{BinDir: binDir}
	var errs []error
	seen := map[string]string{} // provider name -> file
	hash := cryptobyte.NewBuilder(nil)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("credential provider config: %w", err)
		}
		hash.AddUint32LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(data) })
		providers, err := decodeConfig(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("credential provider config %s: %w", file, err))
			continue
		}
		if len(providers) == 0 {
			errs = append(errs, fmt.Errorf("credential provider config %s: providers: Required value: at least 1 provider is required", file))
		}
		for i := range providers {
			p := &providers[i]
			p.File = file
			for _, e := range validateProvider(field.NewPath("providers").Index(i), p, binDir) {
				errs = append(errs, fmt.Errorf("credential provider config %s: provider %q: %s", file, p.Name, e.Error()))
			}
			if other, dup := seen[p.Name]; dup {
				errs = append(errs, fmt.Errorf("credential provider config %s: provider %q: providers[%d].name: Duplicate value: also declared in %s", file, p.Name, i, other))
			}
			seen[p.Name] = file
			cfg.Providers = append(cfg.Providers, *p)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(hash.BytesOrPanic())
	cfg.Hash = fmt.Sprintf("sha256:%x", sum)
	return cfg, nil
}

// configFiles lists the files path stands for (package configfiles).
func configFiles(path string) ([]string, error) {
	files, err := configfiles.List(path)
	if err != nil {
		return nil, fmt.Errorf("credential provider config: %w", err)
	}
	return files, nil
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
			q.Env = append(q.Env, EnvVar{e.Name, e.Value})
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
// (pkg/credentialprovider/plugin/config.go) plus one it checks later, at
// registration: the executable exists in binDir.
func validateProvider(p *field.Path, pr *Provider, binDir string) field.ErrorList {
	var errs field.ErrorList
	switch {
	case pr.Name == "":
		errs = append(errs, field.Required(p.Child("name"), "the plugin's executable name in the bin directory"))
	case strings.Contains(pr.Name, "/"):
		errs = append(errs, field.Invalid(p.Child("name"), pr.Name, "provider name cannot contain '/'"))
	case strings.Contains(pr.Name, " "):
		errs = append(errs, field.Invalid(p.Child("name"), pr.Name, "provider name cannot contain spaces"))
	case pr.Name == "." || pr.Name == "..":
		errs = append(errs, field.Invalid(p.Child("name"), pr.Name, "provider name cannot be '.' or '..'"))
	default:
		bin := filepath.Join(binDir, pr.Name)
		if _, err := exec.LookPath(bin); err != nil {
			errs = append(errs, field.Invalid(p.Child("name"), pr.Name, fmt.Sprintf("no executable %s in the bin directory (%v)", bin, unwrapExecErr(err))))
		}
	}
	if pr.APIVersion == "" {
		errs = append(errs, field.Required(p.Child("apiVersion"), "one of "+strings.Join(pluginapi.SupportedAPIVersions(), ", ")))
	} else if !pluginapi.Supported(pr.APIVersion) {
		errs = append(errs, field.NotSupported(p.Child("apiVersion"), pr.APIVersion, pluginapi.SupportedAPIVersions()))
	}
	if len(pr.MatchImages) == 0 {
		errs = append(errs, field.Required(p.Child("matchImages"), "at least 1 item in matchImages is required"))
	}
	for i, m := range pr.MatchImages {
		if err := keyring.ValidateMatchImage(m); err != nil {
			errs = append(errs, field.Invalid(p.Child("matchImages").Index(i), m, "match image is invalid: "+err.Error()))
		}
	}
	switch {
	case !pr.hasDefaultCacheDuration:
		errs = append(errs, field.Required(p.Child("defaultCacheDuration"), "how long to cache credentials when the plugin does not say"))
	case pr.DefaultCacheDuration < 0:
		errs = append(errs, field.Invalid(p.Child("defaultCacheDuration"), pr.DefaultCacheDuration.String(), "defaultCacheDuration must be greater than or equal to 0"))
	}
	for i, e := range pr.Env {
		if e.Name == "" {
			errs = append(errs, field.Required(p.Child("env").Index(i).Child("name"), ""))
		}
	}
	if t := pr.TokenAttributes; t != nil {
		errs = append(errs, validateTokenAttributes(p.Child("tokenAttributes"), pr.APIVersion, t)...)
	}
	return errs
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

// unwrapExecErr keeps exec.LookPath's errors short: the path is said once.
func unwrapExecErr(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}
