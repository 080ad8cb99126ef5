package execplugin

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/crypto/cryptobyte"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// ConfigFiles returns the files a configuration path stands for, as the
// kubelet reads --image-credential-provider-config: a file is itself; a
// directory is its *.json, *.yaml and *.yml files (not subdirectories), in
// lexicographic order, and must hold at least one. Its errors do not say
// which configuration: LoadConfig prefixes them.
func ConfigFiles(path string) ([]string, error) {
	if path == "" {
		return nil, errors.New("no path given")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".json", ".yaml", ".yml":
			if !e.IsDir() {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.json, *.yaml or *.yml file in directory %s", path)
	}
	return files, nil
}

// ConfigFile is one file of a configuration being loaded: its content, and
// where the kind reports what is wrong with it.
type ConfigFile struct {
	Path string
	Data []byte

	load *loading
}

// loading is the state of one LoadConfig.
type loading struct {
	what     string
	errs     []error
	declared map[string]string // provider name -> file
}

// Fail reports an error of the file as a whole (it does not decode, a
// field outside the providers is wrong).
func (f *ConfigFile) Fail(err error) {
	f.load.errs = append(f.load.errs, fmt.Errorf("%s %s: %w", f.load.what, f.Path, err))
}

// FailProvider reports what is wrong with the provider name, each error
// naming its field.
func (f *ConfigFile) FailProvider(name string, errs field.ErrorList) {
	for _, e := range errs {
		f.load.errs = append(f.load.errs, fmt.Errorf("%s %s: provider %q: %w", f.load.what, f.Path, name, e))
	}
}

// Declare records the provider name, whose name field is p: a name
// declared twice, in this file or another, is an error naming both files.
// An empty name is not recorded: it is an error of its own.
func (f *ConfigFile) Declare(p *field.Path, name string) {
	if name == "" {
		return
	}
	if other, dup := f.load.declared[name]; dup {
		f.load.errs = append(f.load.errs, fmt.Errorf("%s %s: provider %q: %w: also declared in %s", f.load.what, f.Path, name, field.Duplicate(p, name), other))
		return
	}
	f.load.declared[name] = f.Path
}

// LoadConfig reads the configuration at path (ConfigFiles) file by file,
// in order, handing each file's content to decode, which reports on the
// file what is wrong. It returns the hash of the configuration's content
// ("sha256:...", the files' contents length-prefixed, in order) and every
// error at once, each prefixed with what (the kind's configuration, as
// "image policy config") and the file. A path that stands for no file,
// or a file that cannot be read, fails at once.
func LoadConfig(what, path string, decode func(f *ConfigFile)) (hash string, err error) {
	files, err := ConfigFiles(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	l := &loading{what: what, declared: map[string]string{}}
	h := cryptobyte.NewBuilder(nil)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		h.AddUint32LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes(data) })
		decode(&ConfigFile{Path: file, Data: data, load: l})
	}
	if err := errors.Join(l.errs...); err != nil {
		return "", err
	}
	return fmt.Sprintf("sha256:%x", sha256.Sum256(h.BytesOrPanic())), nil
}

// DecodeStrict decodes a configuration file, YAML or JSON, into v
// strictly: an unknown, misspelt or duplicate field is an error naming its
// path. (Credential providers decode through the kubelet's scheme instead:
// three versions of its type, converted.)
func DecodeStrict(data []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(js, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// EnvVar is an environment variable a provider's configuration gives its
// plugin.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Entry is what every kind's provider entry says of its plugin: what it
// is, how it is spoken to and run, which images it is for.
type Entry struct {
	// Name is the provider's, and its executable's in the bin directory.
	Name string
	// APIVersion is the plugin API version of its requests and responses.
	APIVersion  string
	MatchImages []string
	Args        []string
	Env         []EnvVar
}

// ValidateEntry applies the rules every kind's provider entry follows,
// the kubelet's for a credential provider (pkg/credentialprovider/plugin,
// config.go) plus one it checks later, at registration: the name is an
// executable in binDir. apiVersions are the kind's plugin API versions,
// sorted. p is the entry's path; every error names its field.
func ValidateEntry(p *field.Path, e Entry, binDir string, apiVersions []string) field.ErrorList {
	var errs field.ErrorList
	switch {
	case e.Name == "":
		errs = append(errs, field.Required(p.Child("name"), "the plugin's executable name in the bin directory"))
	case strings.Contains(e.Name, "/"):
		errs = append(errs, field.Invalid(p.Child("name"), e.Name, "provider name cannot contain '/'"))
	case strings.Contains(e.Name, " "):
		errs = append(errs, field.Invalid(p.Child("name"), e.Name, "provider name cannot contain spaces"))
	case e.Name == "." || e.Name == "..":
		errs = append(errs, field.Invalid(p.Child("name"), e.Name, "provider name cannot be '.' or '..'"))
	default:
		bin := filepath.Join(binDir, e.Name)
		if _, err := exec.LookPath(bin); err != nil {
			// exec.LookPath's error says the path again: its cause is enough.
			var ee *exec.Error
			if errors.As(err, &ee) {
				err = ee.Err
			}
			errs = append(errs, field.Invalid(p.Child("name"), e.Name, fmt.Sprintf("no executable %s in the bin directory (%v)", bin, err)))
		}
	}
	if e.APIVersion == "" {
		errs = append(errs, field.Required(p.Child("apiVersion"), "one of "+strings.Join(apiVersions, ", ")))
	} else if !slices.Contains(apiVersions, e.APIVersion) {
		errs = append(errs, field.NotSupported(p.Child("apiVersion"), e.APIVersion, apiVersions))
	}
	if len(e.MatchImages) == 0 {
		errs = append(errs, field.Required(p.Child("matchImages"), "at least 1 item in matchImages is required"))
	}
	for i, m := range e.MatchImages {
		if err := keyring.ValidateMatchImage(m); err != nil {
			errs = append(errs, field.Invalid(p.Child("matchImages").Index(i), m, "match image is invalid: "+err.Error()))
		}
	}
	for i, v := range e.Env {
		if v.Name == "" {
			errs = append(errs, field.Required(p.Child("env").Index(i).Child("name"), ""))
		}
	}
	return errs
}
