package decision

import "strings"

// neverVerifyAllowlisted is NeverVerifyAllowlistedImages: an image of an
// allowlisted repository is free to use; every other image, preloaded or
// not, needs verification. As in the kubelet, "pulled by" does not matter.
type neverVerifyAllowlisted struct {
	exact    map[string]bool
	prefixes []string // each ends in "/"
}

func newNeverVerifyAllowlisted(allowlist []string) Policy {
	p := neverVerifyAllowlisted{exact: map[string]bool{}}
	for _, a := range allowlist {
		if prefix, ok := strings.CutSuffix(a, "*"); ok {
			p.prefixes = append(p.prefixes, prefix)
		} else {
			p.exact[a] = true
		}
	}
	return p
}

func (neverVerifyAllowlisted) Name() PolicyName { return NeverVerifyAllowlistedImages }

func (p neverVerifyAllowlisted) VerificationRequired(repo string, _ bool) bool {
	return !p.allowlisted(repo)
}

func (p neverVerifyAllowlisted) MayNeedVerification(repo string, _ RepoMemory) bool {
	return !p.allowlisted(repo)
}

func (neverVerifyAllowlisted) WhyNot(repo string) string {
	return repo + " is on the allowlist"
}

// allowlisted reports whether repo (normalized) is on the allowlist.
func (p neverVerifyAllowlisted) allowlisted(repo string) bool {
	if repo == "" {
		return false
	}
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
