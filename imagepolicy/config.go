package imagepolicy

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// The configuration file's type.
const (
	ConfigAPIVersion = "config.cri-image-proxy.io/v1alpha1"
	ConfigKind       = "ImagePolicyConfig"
)

// Defaults of a provider.
const (
	// DefaultTimeout bounds one plugin run. Below the kubelet's 2-minute
	// runtime request timeout, so that a hung plugin is a clear refusal,
	// not a CreateContainer deadline.
	DefaultTimeout = 30 * time.Second
	// DefaultAllowCacheDuration keeps an allow: a reload (SIGHUP) drops it
	// sooner, so a revoked key takes effect without waiting.
	DefaultAllowCacheDuration = time.Hour
	// DefaultDenyCacheDuration keeps a deny: short, so that an image
	// signed after a refusal runs soon, long enough to spare the plugin a
	// crash-looping pod's retries.
	DefaultDenyCacheDuration = time.Minute
)

// FailurePolicy says what a provider's fault means: the plugin crashed,
// hung, printed garbage or another version.
type FailurePolicy string

// The failure policies.
const (
	// Fail refuses the image: fail closed, the default.
	Fail FailurePolicy = "Fail"
	// Ignore allows it, as if the provider did not apply.
	Ignore FailurePolicy = "Ignore"
)

// AllNamespaces in a provider's namespaces makes it apply to every one.
const AllNamespaces = "*"

// NoMatchPolicy says what happens to an image no provider applies to in a
// namespace (sigstore policy-controller's no-match policy, per namespace):
// none of the namespace's providers, or no provider at all, covers its
// registry (another name of a covered registry, an alias, an IP address,
// an unknown registry).
type NoMatchPolicy string

// The no-match policies.
const (
	// NoMatchAllow allows the image: the default.
	NoMatchAllow NoMatchPolicy = "Allow"
	// NoMatchWarn allows it, with a warning in the log and a count in
	// cri_image_proxy_image_policy_decisions_total (no_provider_warned).
	NoMatchWarn NoMatchPolicy = "Warn"
	// NoMatchDeny refuses it: only images a provider covers (and allows)
	// run in the namespace.
	NoMatchDeny NoMatchPolicy = "Deny"
)

// noMatchPolicies are the supported values, for messages.
var noMatchPolicies = []string{string(NoMatchAllow), string(NoMatchWarn), string(NoMatchDeny)}

// NoMatchRules are the no-match policies of the namespaces.
type NoMatchRules struct {
	// Default is the policy of a namespace not listed; Allow unless set.
	Default NoMatchPolicy
	// Namespaces are the namespaces with a policy of their own.
	Namespaces map[string]NoMatchPolicy
}

// For is the no-match policy of namespace.
func (r NoMatchRules) For(namespace string) NoMatchPolicy {
	if p, ok := r.Namespaces[namespace]; ok {
		return p
	}
	return r.DefaultPolicy()
}

// DefaultPolicy is the no-match policy of a namespace not listed.
func (r NoMatchRules) DefaultPolicy() NoMatchPolicy {
	if r.Default == "" {
		return NoMatchAllow
	}
	return r.Default
}

// Config is a loaded, validated image policy configuration.
type Config struct {
	// Providers in the order they are asked: files in lexicographic order,
	// providers in file order.
	Providers []Provider
	// DefaultNamespace is the namespace of a pull that names no pod
	// (crictl without a pod config, a bake job); empty: such pulls are
	// decided for the empty namespace, which only "*" providers cover.
	DefaultNamespace string
	// NoMatch says, per namespace, what happens to an image no provider
	// applies to.
	NoMatch NoMatchRules
	// BinDir holds the plugin executables.
	BinDir string
	// Hash identifies the configuration's content ("sha256:...").
	Hash string
}

// Provider is one configured policy plugin.
type Provider struct {
	Name string
	// APIVersion is the plugin API version of the request and response.
	APIVersion  string
	MatchImages []string
	// Namespaces the provider applies to; "*" for all.
	Namespaces         []string
	Timeout            time.Duration
	FailurePolicy      FailurePolicy
	AllowCacheDuration time.Duration
	DenyCacheDuration  time.Duration
	// SendCredentials gives the plugin the pull's registry credential.
	SendCredentials bool
	Args            []string
	Env             []EnvVar
	// WatchFiles are the plugin's own files (its policy, its keys) and
	// directories: a change of one drops the provider's cached verdicts.
	// Absolute paths, cleaned.
	WatchFiles []string
	// WatchFilesFromArgs is true when WatchFiles were not configured but
	// taken from Args (see watchFilesOf).
	WatchFilesFromArgs bool
	// File is where the provider was declared, for messages.
	File string
}

// EnvVar is an environment variable for the plugin.
type EnvVar = execplugin.EnvVar

// configFile is the file on disk.
type configFile struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// DefaultNamespace: see Config.
	DefaultNamespace string           `json:"defaultNamespace,omitempty"`
	NoMatchPolicy    *noMatchConfig   `json:"noMatchPolicy,omitempty"`
	Providers        []providerConfig `json:"providers,omitempty"`
}

// noMatchConfig is a file's noMatchPolicy.
type noMatchConfig struct {
	Default    NoMatchPolicy            `json:"default,omitempty"`
	Namespaces map[string]NoMatchPolicy `json:"namespaces,omitempty"`
}

type providerConfig struct {
	Name               string           `json:"name"`
	APIVersion         string           `json:"apiVersion"`
	MatchImages        []string         `json:"matchImages"`
	Namespaces         []string         `json:"namespaces"`
	Timeout            *metav1.Duration `json:"timeout,omitempty"`
	FailurePolicy      FailurePolicy    `json:"failurePolicy,omitempty"`
	AllowCacheDuration *metav1.Duration `json:"allowCacheDuration,omitempty"`
	DenyCacheDuration  *metav1.Duration `json:"denyCacheDuration,omitempty"`
	SendCredentials    bool             `json:"sendCredentials,omitempty"`
	Args               []string         `json:"args,omitempty"`
	Env                []EnvVar         `json:"env,omitempty"`
	// WatchFiles: nil (absent) takes them from args; [] watches nothing.
	WatchFiles *[]string `json:"watchFiles,omitempty"`
}

// LoadConfig reads an ImagePolicyConfig from a file, or from every *.json,
// *.yaml and *.yml file of a directory in lexicographic order, and
// validates it against binDir. Every error names the file, the provider
// and the field; all are reported at once.
func LoadConfig(path, binDir string) (*Config, error) {
	cfg := &Config{BinDir: binDir, NoMatch: NoMatchRules{Default: NoMatchAllow, Namespaces: map[string]NoMatchPolicy{}}}
	defaultFrom := ""
	noMatchFrom := map[string]string{} // namespace ("" for the default) -> file
	hash, err := execplugin.LoadConfig(kind.Config, path, func(f *execplugin.ConfigFile) {
		fc, err := decodeConfig(f.Data)
		if err != nil {
			f.Fail(err)
			return
		}
		if ns := fc.DefaultNamespace; ns != "" {
			for _, msg := range validation.IsDNS1123Label(ns) {
				f.Fail(field.Invalid(field.NewPath("defaultNamespace"), ns, msg))
			}
			if cfg.DefaultNamespace != "" && cfg.DefaultNamespace != ns {
				f.Fail(field.Invalid(field.NewPath("defaultNamespace"), ns, fmt.Sprintf("%s already says %q", defaultFrom, cfg.DefaultNamespace)))
			}
			cfg.DefaultNamespace, defaultFrom = ns, f.Path
		}
		if len(fc.Providers) == 0 && fc.NoMatchPolicy == nil {
			f.Fail(field.Required(field.NewPath("providers"), "at least 1 provider is required (or a noMatchPolicy alone)"))
		}
		for _, e := range mergeNoMatch(&cfg.NoMatch, fc.NoMatchPolicy, f.Path, noMatchFrom) {
			f.Fail(e)
		}
		for i, pc := range fc.Providers {
			p := field.NewPath("providers").Index(i)
			pr, perrs := validateProvider(p, pc, binDir)
			perrs = append(perrs, watchable(p.Child("watchFiles"), pr.WatchFiles)...)
			if pc.WatchFiles == nil {
				pr.WatchFiles, pr.WatchFilesFromArgs = watchFilesOf(pc.Args), true
			}
			pr.File = f.Path
			f.FailProvider(pc.Name, perrs)
			f.Declare(p.Child("name"), pc.Name)
			cfg.Providers = append(cfg.Providers, pr)
		}
	})
	if err != nil {
		return nil, err
	}
	cfg.Hash = hash
	return cfg, nil
}

// decodeConfig decodes one file strictly: an unknown, misspelt or
// duplicate field is an error naming its path.
func decodeConfig(data []byte) (*configFile, error) {
	var fc configFile
	if err := execplugin.DecodeStrict(data, &fc); err != nil {
		return nil, err
	}
	if fc.APIVersion != ConfigAPIVersion || fc.Kind != ConfigKind {
		return nil, fmt.Errorf("apiVersion/kind is %q/%q, want %q/%q", fc.APIVersion, fc.Kind, ConfigAPIVersion, ConfigKind)
	}
	return &fc, nil
}

// validateProvider validates one entry, by the rules every kind's entry
// follows (execplugin.ValidateEntry: the name, an executable in binDir, the
// apiVersion, matchImages, env) and an image policy provider's own, and
// returns it with its defaults.
func validateProvider(p *field.Path, pc providerConfig, binDir string) (Provider, field.ErrorList) {
	pr := Provider{
		Name: pc.Name, APIVersion: pc.APIVersion, MatchImages: pc.MatchImages, Namespaces: pc.Namespaces,
		Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: DefaultAllowCacheDuration, DenyCacheDuration: DefaultDenyCacheDuration,
		SendCredentials: pc.SendCredentials, Args: pc.Args, Env: pc.Env,
	}
	errs := execplugin.ValidateEntry(p, pr.entry(), binDir, policyapi.SupportedAPIVersions())
	if pc.WatchFiles != nil {
		pr.WatchFiles = []string{}
		for i, f := range *pc.WatchFiles {
			if !filepath.IsAbs(f) {
				errs = append(errs, field.Invalid(p.Child("watchFiles").Index(i), f, "an absolute path of a file or directory the plugin reads"))
				continue
			}
			pr.WatchFiles = append(pr.WatchFiles, filepath.Clean(f))
		}
	}
	errs = append(errs, validateNamespaces(p.Child("namespaces"), pc.Namespaces)...)
	// Each duration has a default (a credential provider's
	// defaultCacheDuration has none and keeps the kubelet's words), and the
	// timeout is each provider's own (credential providers share one,
	// credentialProviders.execTimeout, as the kubelet's plugins do).
	for _, d := range []struct {
		name string
		v    *metav1.Duration
		dst  *time.Duration
		min  time.Duration
	}{
		{"timeout", pc.Timeout, &pr.Timeout, 1},
		{"allowCacheDuration", pc.AllowCacheDuration, &pr.AllowCacheDuration, 0},
		{"denyCacheDuration", pc.DenyCacheDuration, &pr.DenyCacheDuration, 0},
	} {
		if d.v == nil {
			continue
		}
		if d.v.Duration < d.min {
			msg := "must not be negative"
			if d.min > 0 {
				msg = "must be positive"
			}
			errs = append(errs, field.Invalid(p.Child(d.name), d.v.Duration.String(), msg))
		}
		*d.dst = d.v.Duration
	}
	switch pc.FailurePolicy {
	case "":
	case Fail, Ignore:
		pr.FailurePolicy = pc.FailurePolicy
	default:
		errs = append(errs, field.NotSupported(p.Child("failurePolicy"), pc.FailurePolicy, []string{string(Fail), string(Ignore)}))
	}
	return pr, errs
}

// entry is what the provider says of its plugin, as every kind's says it.
func (pr *Provider) entry() execplugin.Entry {
	return execplugin.Entry{Name: pr.Name, APIVersion: pr.APIVersion, MatchImages: pr.MatchImages, Args: pr.Args, Env: pr.Env}
}

// watchFilesOf are the files a provider watches when its configuration
// names none: each argument (or the value of a --flag=value argument)
// that is the absolute path of a regular file, as the reference plugin's
// --policy. Files the policy names in turn (its keys) are not found this
// way: watchFiles lists them.
func watchFilesOf(args []string) []string {
	out := []string{}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			_, v, ok := strings.Cut(a, "=")
			if !ok {
				continue
			}
			a = v
		}
		if !filepath.IsAbs(a) {
			continue
		}
		if fi, err := os.Stat(a); err == nil && fi.Mode().IsRegular() {
			out = append(out, filepath.Clean(a))
		}
	}
	return out
}

// watchable checks that each watched path can be watched: the daemon
// watches a file through its directory (so that a rename over it is
// seen), and a directory itself, so that directory must exist. A file
// itself may come later: its appearance is a change.
func watchable(p *field.Path, paths []string) field.ErrorList {
	var errs field.ErrorList
	for i, f := range paths {
		fi, err := os.Stat(f)
		switch {
		case err == nil && fi.IsDir():
		case err == nil || errors.Is(err, os.ErrNotExist):
			if di, derr := os.Stat(filepath.Dir(f)); derr != nil || !di.IsDir() {
				errs = append(errs, field.Invalid(p.Index(i), f, "cannot be watched: its directory "+filepath.Dir(f)+" does not exist"))
			}
		default:
			errs = append(errs, field.Invalid(p.Index(i), f, "cannot be watched: "+err.Error()))
		}
	}
	return errs
}

// mergeNoMatch adds a file's noMatchPolicy to rules: each namespace, and
// the default, said by one file only (or the same by several), each value
// one of the policies.
func mergeNoMatch(rules *NoMatchRules, nm *noMatchConfig, file string, from map[string]string) field.ErrorList {
	if nm == nil {
		return nil
	}
	var errs field.ErrorList
	p := field.NewPath("noMatchPolicy")
	valid := func(fp *field.Path, v NoMatchPolicy) bool {
		switch v {
		case NoMatchAllow, NoMatchWarn, NoMatchDeny:
			return true
		}
		errs = append(errs, field.NotSupported(fp, v, noMatchPolicies))
		return false
	}
	set := func(fp *field.Path, ns string, v NoMatchPolicy, current NoMatchPolicy) bool {
		if other, ok := from[ns]; ok && current != v {
			errs = append(errs, field.Invalid(fp, v, fmt.Sprintf("%s already says %q", other, current)))
			return false
		}
		from[ns] = file
		return true
	}
	if nm.Default != "" && valid(p.Child("default"), nm.Default) && set(p.Child("default"), "", nm.Default, rules.Default) {
		rules.Default = nm.Default
	}
	for _, ns := range slices.Sorted(maps.Keys(nm.Namespaces)) {
		v := nm.Namespaces[ns]
		fp := p.Child("namespaces").Key(ns)
		if ns == AllNamespaces {
			errs = append(errs, field.Invalid(fp, v, `"*" is no namespace: noMatchPolicy.default is the policy of every namespace not listed`))
			continue
		}
		bad := false
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(fp, ns, msg))
			bad = true
		}
		if bad || !valid(fp, v) {
			continue
		}
		if set(fp, ns, v, rules.Namespaces[ns]) {
			rules.Namespaces[ns] = v
		}
	}
	return errs
}

// validateNamespaces checks a provider's namespaces: at least one, each a
// namespace name or "*" alone.
func validateNamespaces(p *field.Path, namespaces []string) field.ErrorList {
	var errs field.ErrorList
	if len(namespaces) == 0 {
		errs = append(errs, field.Required(p, `the namespaces the provider applies to, or "*" for all`))
	}
	seen := sets.New[string]()
	for i, ns := range namespaces {
		switch {
		case ns == AllNamespaces:
			if len(namespaces) > 1 {
				errs = append(errs, field.Invalid(p.Index(i), ns, `"*" covers every namespace: list it alone`))
			}
		default:
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, field.Invalid(p.Index(i), ns, msg))
			}
		}
		if seen.Has(ns) {
			errs = append(errs, field.Duplicate(p.Index(i), ns))
		}
		seen.Insert(ns)
	}
	return errs
}

// matcher is a provider's matchImages and namespaces, parsed once: a
// cached decision must cost microseconds. The patterns match as the
// runtime reaches registries (keyring.ReachedPattern): every spelling of a
// host (its case, a default port, an IP literal's forms) is that host.
// Credential providers keep the kubelet's letter-for-letter rule, which
// fails closed for them; for a policy the same miss would let an image run
// unchecked.
type matcher struct {
	patterns      []keyring.ReachedPattern
	allNamespaces bool
	namespaces    sets.Set[string]
}

func newMatcher(p Provider) matcher {
	m := matcher{namespaces: sets.New[string]()}
	for _, pat := range p.MatchImages {
		if rp, err := keyring.ParseReachedPattern(pat); err == nil {
			m.patterns = append(m.patterns, rp)
		}
	}
	for _, ns := range p.Namespaces {
		if ns == AllNamespaces {
			m.allNamespaces = true
		}
		m.namespaces.Insert(ns)
	}
	return m
}

// coversNamespace reports whether the provider applies to ns.
func (m matcher) coversNamespace(ns string) bool { return m.allNamespaces || m.namespaces.Has(ns) }

// matchesImage reports whether the provider's matchImages match repo, a
// parsed repository; nil (an image known by ID only) matches every
// provider: what it is cannot be told, so every policy of the namespace
// applies.
func (m matcher) matchesImage(repo *keyring.Repository) bool {
	if repo == nil {
		return true
	}
	for _, g := range m.patterns {
		if g.Match(*repo) {
			return true
		}
	}
	return false
}
