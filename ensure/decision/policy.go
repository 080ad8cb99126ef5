package decision

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

// Policy decides which images need credential verification: one type per
// kubelet policy, each in its own file (policy_*.go), made by NewPolicy
// from the policies table. Every policy must pass
// TestTheFilterNeverSkipsAHide: MayNeedVerification is never false for an
// image the guard would hide.
type Policy interface {
	// Name is the kubelet's name of the policy.
	Name() PolicyName
	// VerificationRequired is the kubelet's
	// RequireCredentialVerificationForImage: whether an image of repo
	// ("" when unknown) needs verification at all, given whether the proxy
	// pulled it.
	VerificationRequired(repo string, pulledByProxy bool) bool
	// MayNeedVerification answers from memory only, erring towards true,
	// whether an image listed as repo may need verification: the
	// ImageStatus filter skips a call when it is false, and CreateContainer
	// lets an image through when the runtime cannot answer.
	MayNeedVerification(repo string, mem RepoMemory) bool
	// WhyNot is the rule, in words, when VerificationRequired is false.
	WhyNot(repo string) string
}

// RepoMemory is what a policy may read of the guard's memory.
type RepoMemory interface {
	// PullInFlight reports a pull of repo through the proxy in flight (or
	// unsettled after a crash, or unrecorded).
	PullInFlight(repo string) bool
	// Restricted reports a record with a mapping for repo that is not
	// accessible to every pod; it may err towards true.
	Restricted(repo string) bool
}

// policies is every policy: its name, what it does (the flag help and
// docs/configuration.md), whether it takes an allowlist, and its
// constructor.
var policies = []struct {
	name      PolicyName
	help      string
	allowlist bool
	make      func(allowlist []string) Policy
}{
	{NeverVerify, "any pod may use any image present on the node", false, func([]string) Policy { return neverVerify{} }},
	{NeverVerifyPreloadedImages, "images the proxy never pulled are free; pulled ones need verification (the default)", false, func([]string) Policy { return neverVerifyPreloaded{} }},
	{NeverVerifyAllowlistedImages, "images on the allowlist are free; every other image needs verification", true, newNeverVerifyAllowlisted},
	{AlwaysVerify, "every image needs verification", false, func([]string) Policy { return alwaysVerify{} }},
}

// Policies lists the supported policy names.
var Policies = func() []string {
	out := make([]string, 0, len(policies))
	for _, p := range policies {
		out = append(out, string(p.name))
	}
	return out
}()

// PolicyHelp says what each policy does, one line per policy, for flag
// help and the configuration reference.
func PolicyHelp() string {
	lines := make([]string, 0, len(policies))
	for _, p := range policies {
		lines = append(lines, string(p.name)+": "+p.help)
	}
	return strings.Join(lines, "\n")
}

// NewPolicy returns the named policy; allowlist is used by
// NeverVerifyAllowlistedImages and must be empty for the others.
func NewPolicy(name PolicyName, allowlist []string) (Policy, error) {
	if errs := ValidatePolicy(field.NewPath("policy"), name, allowlist); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	for _, p := range policies {
		if p.name == name {
			return p.make(allowlist), nil
		}
	}
	return nil, fmt.Errorf("policy %q: not supported", name) // unreachable: validated
}

// ValidatePolicy checks a policy and its allowlist as the kubelet does
// (pkg/kubelet/images/pullmanager/image_pull_policies.go).
func ValidatePolicy(path *field.Path, name PolicyName, allowlist []string) field.ErrorList {
	var errs field.ErrorList
	known := false
	for _, p := range policies {
		if p.name != name {
			continue
		}
		known = true
		if !p.allowlist && len(allowlist) > 0 {
			errs = append(errs, field.Forbidden(path.Child("preloadedImagesVerificationAllowlist"), "only with policy "+string(NeverVerifyAllowlistedImages)))
		}
	}
	if !known {
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
