package main

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/keyring"
)

// The policy file's type.
const (
	PolicyAPIVersion = "config.cri-image-proxy.io/v1alpha1"
	PolicyKind       = "SigstoreImagePolicy"
)

// Whether a transparency log entry or an SCT is required.
const (
	Require = "Require"
	Ignore  = "Ignore"
)

// policyFile is the file on disk.
type policyFile struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// TrustedRoot is a sigstore trusted_root.json (Fulcio, Rekor, CT logs,
	// timestamp authorities): required by keyless authorities and by any
	// that requires a transparency log entry.
	TrustedRoot string `json:"trustedRoot,omitempty"`
	// Registries say how to reach registries other than at https://host.
	Registries []registryConfig `json:"registries,omitempty"`
	// Policies, the first covering the namespace and the image decides.
	Policies []namespacePolicy `json:"policies"`
}

type registryConfig struct {
	// Host is the registry as image references name it: "registry.test",
	// "127.0.0.1:5000".
	Host string `json:"host"`
	// Endpoint is where to reach it, http:// or https://; default
	// https://host (http for loopback addresses).
	Endpoint string `json:"endpoint,omitempty"`
	// CAFile holds PEM certificates to trust for it, beside the system's.
	CAFile string `json:"caFile,omitempty"`
}

type namespacePolicy struct {
	Name string `json:"name"`
	// Namespaces it covers; "*" for all.
	Namespaces []string `json:"namespaces"`
	// Images it covers, in the kubelet's matchImages syntax; absent: all.
	Images []string `json:"images,omitempty"`
	// Authorities: a signature verifying for any one allows the image.
	Authorities []authorityConfig `json:"authorities"`
}

type authorityConfig struct {
	Name    string         `json:"name"`
	Key     *keyConfig     `json:"key,omitempty"`
	Keyless *keylessConfig `json:"keyless,omitempty"`
	// TransparencyLog: Require (default for keyless) or Ignore (default
	// for keys). Keyless without a log entry needs a signed timestamp.
	TransparencyLog string `json:"transparencyLog,omitempty"`
}

type keyConfig struct {
	// Path or Data: a PEM public key (ECDSA, RSA or Ed25519), as cosign.pub.
	Path string `json:"path,omitempty"`
	Data string `json:"data,omitempty"`
}

type keylessConfig struct {
	// Identities: a certificate matching any one of them is accepted.
	Identities []identityConfig `json:"identities"`
	// CertificateTransparency: Require (default) an SCT in the
	// certificate, or Ignore.
	CertificateTransparency string `json:"certificateTransparency,omitempty"`
}

type identityConfig struct {
	Issuer        string `json:"issuer,omitempty"`
	IssuerRegExp  string `json:"issuerRegExp,omitempty"`
	Subject       string `json:"subject,omitempty"`
	SubjectRegExp string `json:"subjectRegExp,omitempty"`
}

// Policy is a loaded, validated policy file.
type Policy struct {
	File        string
	trustedRoot root.TrustedMaterial
	registries  map[string]registryConfig
	policies    []*nsPolicy
}

type nsPolicy struct {
	name        string
	namespaces  []string
	images      []string
	authorities []*authority
}

// authority is one way a signature is accepted, ready to verify.
type authority struct {
	name     string
	describe string // "key release.pub", "keyless ci@example.com from https://issuer"
	verifier *verify.Verifier
	// key: the signature must be made by the key; else by a certificate
	// matching one of identities.
	key        bool
	identities []verify.CertificateIdentity
}

// LoadPolicy reads and validates a policy file; every error names the
// field.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	var pf policyFile
	strictErrs, err := kjson.UnmarshalStrict(js, &pf, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strictErrs...)
	}
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", path, err)
	}
	if pf.APIVersion != PolicyAPIVersion || pf.Kind != PolicyKind {
		return nil, fmt.Errorf("policy %s: apiVersion/kind is %q/%q, want %q/%q", path, pf.APIVersion, pf.Kind, PolicyAPIVersion, PolicyKind)
	}
	p, errs := build(&pf)
	if len(errs) > 0 {
		return nil, fmt.Errorf("policy %s: %w", path, errs.ToAggregate())
	}
	p.File = path
	return p, nil
}

// build validates pf and makes the verifiers.
func build(pf *policyFile) (*Policy, field.ErrorList) {
	var errs field.ErrorList
	p := &Policy{registries: map[string]registryConfig{}}
	if pf.TrustedRoot != "" {
		tr, err := root.NewTrustedRootFromPath(pf.TrustedRoot)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath("trustedRoot"), pf.TrustedRoot, "not a sigstore trusted root: "+err.Error()))
		} else {
			p.trustedRoot = tr
		}
	}
	for i, r := range pf.Registries {
		fp := field.NewPath("registries").Index(i)
		if r.Host == "" || strings.ContainsAny(r.Host, "/ ") {
			errs = append(errs, field.Invalid(fp.Child("host"), r.Host, "a registry host[:port], as image references name it"))
		}
		host := canonicalHost(r.Host)
		if _, dup := p.registries[host]; dup {
			errs = append(errs, field.Duplicate(fp.Child("host"), r.Host))
		}
		if r.Endpoint != "" {
			if u, err := url.Parse(r.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
				errs = append(errs, field.Invalid(fp.Child("endpoint"), r.Endpoint, "an http:// or https:// URL with a host and no path"))
			}
		}
		if r.CAFile != "" {
			if b, err := os.ReadFile(r.CAFile); err != nil {
				errs = append(errs, field.Invalid(fp.Child("caFile"), r.CAFile, err.Error()))
			} else if _, err := cryptoutils.UnmarshalCertificatesFromPEM(b); err != nil {
				errs = append(errs, field.Invalid(fp.Child("caFile"), r.CAFile, "no PEM certificate: "+err.Error()))
			}
		}
		p.registries[host] = r
	}
	if len(pf.Policies) == 0 {
		errs = append(errs, field.Required(field.NewPath("policies"), "at least 1 policy"))
	}
	names := map[string]bool{}
	for i, np := range pf.Policies {
		fp := field.NewPath("policies").Index(i)
		if np.Name == "" {
			errs = append(errs, field.Required(fp.Child("name"), "for the reasons"))
		} else if names[np.Name] {
			errs = append(errs, field.Duplicate(fp.Child("name"), np.Name))
		}
		names[np.Name] = true
		if len(np.Namespaces) == 0 {
			errs = append(errs, field.Required(fp.Child("namespaces"), `the namespaces it covers, or "*"`))
		}
		for j, ns := range np.Namespaces {
			if ns == "*" {
				continue
			}
			for _, msg := range validation.IsDNS1123Label(ns) {
				errs = append(errs, field.Invalid(fp.Child("namespaces").Index(j), ns, msg))
			}
		}
		for j, m := range np.Images {
			if err := keyring.ValidateMatchImage(m); err != nil {
				errs = append(errs, field.Invalid(fp.Child("images").Index(j), m, err.Error()))
			}
		}
		if len(np.Authorities) == 0 {
			errs = append(errs, field.Required(fp.Child("authorities"), "at least 1: a key or a keyless identity"))
		}
		pol := &nsPolicy{name: np.Name, namespaces: np.Namespaces, images: np.Images}
		for j, ac := range np.Authorities {
			a, aerrs := newAuthority(fp.Child("authorities").Index(j), ac, p.trustedRoot, pf.TrustedRoot != "")
			errs = append(errs, aerrs...)
			if a != nil {
				pol.authorities = append(pol.authorities, a)
			}
		}
		p.policies = append(p.policies, pol)
	}
	return p, errs
}

// newAuthority validates one authority and builds its verifier.
func newAuthority(fp *field.Path, ac authorityConfig, tr root.TrustedMaterial, haveRoot bool) (*authority, field.ErrorList) {
	var errs field.ErrorList
	if ac.Name == "" {
		errs = append(errs, field.Required(fp.Child("name"), "for the reasons"))
	}
	if (ac.Key == nil) == (ac.Keyless == nil) {
		return nil, append(errs, field.Invalid(fp, ac.Name, "exactly one of key and keyless"))
	}
	tlog := ac.TransparencyLog
	switch tlog {
	case "":
		tlog = Ignore
		if ac.Keyless != nil {
			tlog = Require
		}
	case Require, Ignore:
	default:
		errs = append(errs, field.NotSupported(fp.Child("transparencyLog"), tlog, []string{Require, Ignore}))
	}
	needRoot := tlog == Require || ac.Keyless != nil
	if needRoot && !haveRoot {
		errs = append(errs, field.Required(field.NewPath("trustedRoot"), fmt.Sprintf("%s needs a trusted root (keyless, or a transparency log required)", fp)))
	}
	a := &authority{name: ac.Name}
	var material root.TrustedMaterial
	var opts []verify.VerifierOption
	var more field.ErrorList
	if ac.Key != nil {
		material, opts, more = a.withKey(fp, ac.Key, tr, tlog)
	} else {
		material, opts, more = a.withKeyless(fp, ac.Keyless, tr, tlog)
	}
	errs = append(errs, more...)
	if len(errs) > 0 || material == nil {
		// material is nil when the trusted root it needs did not load: that
		// error is the root's, reported where it is read.
		return nil, errs
	}
	v, err := verify.NewVerifier(material, opts...)
	if err != nil {
		return nil, append(errs, field.Invalid(fp, ac.Name, err.Error()))
	}
	a.verifier = v
	return a, nil
}

// withKey makes a an authority of a public key: trusted for whatever hint
// a signature carries, with the transparency log's entries checked against
// tr when tlog requires them. It returns the verifier's material and
// options; nil material with no error when tr is needed and absent.
func (a *authority) withKey(fp *field.Path, k *keyConfig, tr root.TrustedMaterial, tlog string) (root.TrustedMaterial, []verify.VerifierOption, field.ErrorList) {
	a.key = true
	pub, desc, err := loadKey(k)
	if err != nil {
		return nil, nil, field.ErrorList{field.Invalid(fp.Child("key"), desc, err.Error())}
	}
	a.describe = "key " + desc
	v, err := signature.LoadDefaultVerifier(pub)
	if err != nil {
		return nil, nil, field.ErrorList{field.Invalid(fp.Child("key"), desc, err.Error())}
	}
	// A key is trusted for whatever hint a signature carries: cosign's
	// simple signing names no key, and the authority has one.
	keyMaterial := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
		return root.NewExpiringKey(v, time.Time{}, time.Time{}), nil
	})
	if tlog != Require {
		return keyMaterial, []verify.VerifierOption{verify.WithNoObserverTimestamps()}, nil
	}
	if tr == nil {
		return nil, nil, nil
	}
	return root.TrustedMaterialCollection{tr, keyMaterial}, []verify.VerifierOption{verify.WithTransparencyLog(1), verify.WithIntegratedTimestamps(1)}, nil
}

// withKeyless makes a an authority of keyless identities (an issuer and a
// subject each, exact or by regular expression), verified against tr's
// certificate authorities, timestamps and, unless ignored, certificate
// transparency. Nil material with the identities' errors when tr is
// absent.
func (a *authority) withKeyless(fp *field.Path, kl *keylessConfig, tr root.TrustedMaterial, tlog string) (root.TrustedMaterial, []verify.VerifierOption, field.ErrorList) {
	var errs field.ErrorList
	if len(kl.Identities) == 0 {
		errs = append(errs, field.Required(fp.Child("keyless", "identities"), "at least 1 identity (issuer and subject)"))
	}
	var described []string
	for i, id := range kl.Identities {
		ip := fp.Child("keyless", "identities").Index(i)
		if (id.Issuer == "") == (id.IssuerRegExp == "") {
			errs = append(errs, field.Invalid(ip, id.Issuer+id.IssuerRegExp, "exactly one of issuer and issuerRegExp"))
		}
		if (id.Subject == "") == (id.SubjectRegExp == "") {
			errs = append(errs, field.Invalid(ip, id.Subject+id.SubjectRegExp, "exactly one of subject and subjectRegExp"))
		}
		for _, re := range []struct{ name, v string }{{"issuerRegExp", id.IssuerRegExp}, {"subjectRegExp", id.SubjectRegExp}} {
			if re.v != "" {
				if _, err := regexp.Compile(re.v); err != nil {
					errs = append(errs, field.Invalid(ip.Child(re.name), re.v, err.Error()))
				}
			}
		}
		ci, err := verify.NewShortCertificateIdentity(id.Issuer, id.IssuerRegExp, id.Subject, id.SubjectRegExp)
		if err != nil {
			errs = append(errs, field.Invalid(ip, id, err.Error()))
			continue
		}
		a.identities = append(a.identities, ci)
		described = append(described, first(id.Subject, id.SubjectRegExp)+" from "+first(id.Issuer, id.IssuerRegExp))
	}
	a.describe = "keyless " + strings.Join(described, " or ")
	if tr == nil {
		return nil, nil, errs
	}
	var opts []verify.VerifierOption
	if tlog == Require {
		opts = append(opts, verify.WithTransparencyLog(1), verify.WithObserverTimestamps(1))
	} else {
		opts = append(opts, verify.WithSignedTimestamps(1))
	}
	switch kl.CertificateTransparency {
	case "", Require:
		opts = append(opts, verify.WithSignedCertificateTimestamps(1))
	case Ignore:
	default:
		errs = append(errs, field.NotSupported(fp.Child("keyless", "certificateTransparency"), kl.CertificateTransparency, []string{Require, Ignore}))
	}
	return tr, opts, errs
}

// loadKey reads a PEM public key; desc names it for reasons.
func loadKey(k *keyConfig) (crypto.PublicKey, string, error) {
	data, desc := []byte(k.Data), "(inline)"
	switch {
	case (k.Path == "") == (k.Data == ""):
		return nil, "", errors.New("exactly one of path and data")
	case k.Path != "":
		desc = k.Path
		var err error
		if data, err = os.ReadFile(k.Path); err != nil {
			return nil, desc, err
		}
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(data)
	if err != nil {
		return nil, desc, fmt.Errorf("not a PEM public key: %w", err)
	}
	if _, err := x509.MarshalPKIXPublicKey(pub); err != nil {
		return nil, desc, err
	}
	return pub, desc, nil
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// canonicalHost is a registry host in the form every spelling of it has
// (case-folded, an IP literal canonical), for the registries' keys.
func canonicalHost(host string) string { return keyring.CanonicalRepository(host) }

// registryFor is the registries entry for host: the one naming it in any
// spelling, else one naming it with or without its scheme's default port
// (443, 80), as the runtime reaches it; false for none.
func (p *Policy) registryFor(host string) (registryConfig, bool) {
	if rc, ok := p.registries[canonicalHost(host)]; ok {
		return rc, true
	}
	for _, k := range slices.Sorted(maps.Keys(p.registries)) {
		if keyring.SameHost(k, host) {
			return p.registries[k], true
		}
	}
	return registryConfig{}, false
}

// forImage returns the first policy covering namespace and repository,
// its images matched as the runtime reaches registries (as the proxy
// matches matchImages): every spelling of a host is that host.
func (p *Policy) forImage(namespace, repository string) *nsPolicy {
	for _, np := range p.policies {
		if !covers(np.namespaces, namespace) {
			continue
		}
		if len(np.images) == 0 {
			return np
		}
		for _, m := range np.images {
			if keyring.MatchImageAsReached(m, repository) {
				return np
			}
		}
	}
	return nil
}

func covers(namespaces []string, ns string) bool {
	for _, n := range namespaces {
		if n == "*" || n == ns {
			return true
		}
	}
	return false
}
