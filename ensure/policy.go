package ensure

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// PolicyName is the kubelet's imagePullCredentialsVerificationPolicy.
type PolicyName = kubeletconfigv1beta1.ImagePullCredentialsVerificationPolicy

// The policies, with the kubelet's names and meaning.
const (
	// NeverVerify: any pod may use any image present on the node.
	NeverVerify = kubeletconfigv1beta1.NeverVerify
	// NeverVerifyPreloadedImages (the default): images the proxy never
	// pulled (preloaded) are free to use; pulled ones need verification.
	NeverVerifyPreloadedImages = kubeletconfigv1beta1.NeverVerifyPreloadedImages
	// NeverVerifyAllowlistedImages: images on the allowlist are free to
	// use; every other image, preloaded or not, needs verification.
	NeverVerifyAllowlistedImages = kubeletconfigv1beta1.NeverVerifyAllowlistedImages
	// AlwaysVerify: every image needs verification.
	AlwaysVerify = kubeletconfigv1beta1.AlwaysVerify
)

// Policies lists the supported policy names.
var Policies = []string{string(NeverVerify), string(NeverVerifyPreloadedImages), string(NeverVerifyAllowlistedImages), string(AlwaysVerify)}

// Policy decides which images need credential verification.
type Policy struct {
	name     PolicyName
	exact    map[string]bool
	prefixes []string // each ends in "/"
}

// NewPolicy returns the named policy; allowlist is used by
// NeverVerifyAllowlistedImages and must be empty for the others.
func NewPolicy(name PolicyName, allowlist []string) (*Policy, error) {
	if errs := ValidatePolicy(field.NewPath("policy"), name, allowlist); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	p := &Policy{name: name, exact: map[string]bool{}}
	for _, a := range allowlist {
		if prefix, ok := strings.CutSuffix(a, "*"); ok {
			p.prefixes = append(p.prefixes, prefix)
		} else {
			p.exact[a] = true
		}
	}
	return p, nil
}

// Name returns the policy's name.
func (p *Policy) Name() PolicyName { return p.name }

// ValidatePolicy checks a policy and its allowlist as the kubelet does
// (pkg/kubelet/images/pullmanager/image_pull_policies.go).
func ValidatePolicy(path *field.Path, name PolicyName, allowlist []string) field.ErrorList {
	var errs field.ErrorList
	switch name {
	case NeverVerify, NeverVerifyPreloadedImages, AlwaysVerify:
		if len(allowlist) > 0 {
			errs = append(errs, field.Forbidden(path.Child("preloadedImagesVerificationAllowlist"), "only with policy "+string(NeverVerifyAllowlistedImages)))
		}
	case NeverVerifyAllowlistedImages:
	default:
		errs = append(errs, field.NotSupported(path.Child("imagePullCredentialsVerificationPolicy"), name, Policies))
	}
	for i, a := range allowlist {
		if err := validateAllowlistPattern(a); err != nil {
			errs = append(errs, field.Invalid(path.Child("preloadedImagesVerificationAllowlist").Index(i), a, err.Error()))
		}
	}
	return errs
}

// validateAllowlistPattern applies the kubelet's rules: no surrounding
// spaces; "*" only as a trailing "/*" after at least a registry host; a
// pattern without a wildcard is a normalized repository without tag or
// digest.
func validateAllowlistPattern(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("the pattern is empty")
	case strings.TrimSpace(p) != p:
		return fmt.Errorf("leading or trailing spaces are not allowed")
	}
	if prefix, ok := strings.CutSuffix(p, "/*"); ok {
		if prefix == "" {
			return fmt.Errorf("at least registry hostname is required")
		}
		if strings.Contains(prefix, "*") {
			return fmt.Errorf("only a trailing /* wildcard is allowed")
		}
		return nil
	}
	if strings.Contains(p, "*") {
		return fmt.Errorf("only a trailing /* wildcard is allowed")
	}
	named, err := reference.ParseNormalizedNamed(p)
	if err != nil {
		return fmt.Errorf("not a repository: %v", err)
	}
	if named.Name() != p {
		return fmt.Errorf("must be a normalized repository without tag or digest (%s)", named.Name())
	}
	return nil
}

// allowlisted reports whether repo (normalized) is on the allowlist.
func (p *Policy) allowlisted(repo string) bool {
	if p.exact[repo] {
		return true
	}
	for _, prefix := range p.prefixes {
		if strings.HasPrefix(repo, prefix) {
			return true
		}
	}
	return false
}

// verificationRequired is the kubelet's RequireCredentialVerificationForImage:
// whether repo needs verification at all, given whether the proxy pulled it.
func (p *Policy) verificationRequired(repo string, pulledByProxy bool) bool {
	switch p.name {
	case NeverVerify:
		return false
	case NeverVerifyPreloadedImages:
		return pulledByProxy
	case NeverVerifyAllowlistedImages:
		// As in the kubelet, "pulled by" does not matter here: allowlisted
		// images never need verification, every other image does.
		return !p.allowlisted(repo)
	}
	return true // AlwaysVerify, and anything unknown
}
