package config

import (
	"errors"
	"fmt"
	"os"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Load reads, decodes, defaults and validates the file at path.
func Load(path string) (*ProxyConfiguration, error) {
	c, err := Read(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Read reads and decodes the file at path and fills defaults; it does not
// validate, so that flags can be applied first.
func Read(path string) (*ProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Decode decodes YAML or JSON strictly and fills defaults; it does not
// validate, so that flags can be applied first.
func Decode(data []byte) (*ProxyConfiguration, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	c := &ProxyConfiguration{}
	// sigs.k8s.io/json names the full path of an unknown field, as
	// Kubernetes component configs do ("socket.pth").
	strictErrs, err := kjson.UnmarshalStrict(js, c, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, err
	}
	if len(strictErrs) > 0 {
		return nil, errors.Join(strictErrs...)
	}
	if c.APIVersion != APIVersion || c.Kind != Kind {
		return nil, fmt.Errorf("apiVersion/kind is %q/%q, want %q/%q", c.APIVersion, c.Kind, APIVersion, Kind)
	}
	c.SetDefaults()
	return c, nil
}

// Deprecation is a deprecated field a configuration sets, and the field
// that replaces it.
type Deprecation struct {
	Field, Use string
}

func (d Deprecation) String() string {
	return fmt.Sprintf("%s is deprecated: use %s (the old field is still read)", d.Field, d.Use)
}

// Deprecations are the deprecated fields c sets, for a warning: a file
// that sets one keeps working.
func (c *ProxyConfiguration) Deprecations() []Deprecation {
	var out []Deprecation
	if c.EnsureSecretPulledImages.RegistryHostsDir != "" {
		out = append(out, Deprecation{deprecatedHostsDir.String(), registryHostsDir.String()})
	}
	if c.EnsureSecretPulledImages.VouchedMirrors != nil {
		out = append(out, Deprecation{deprecatedVouchedMirrors.String(), registryVouchedMirrors.String()})
	}
	return out
}

// DropDeprecated clears the deprecated fields of a valid configuration,
// whose values SetDefaults gave their successors: what is left says the
// same in the current fields.
func (c *ProxyConfiguration) DropDeprecated() {
	c.EnsureSecretPulledImages.RegistryHostsDir = ""
	c.EnsureSecretPulledImages.VouchedMirrors = nil
}
