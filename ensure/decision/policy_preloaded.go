package decision

// neverVerifyPreloaded is NeverVerifyPreloadedImages, the default: an image
// the proxy never pulled (preloaded) is free to use; a pulled one needs
// verification.
type neverVerifyPreloaded struct{}

func (neverVerifyPreloaded) Name() PolicyName { return NeverVerifyPreloadedImages }

func (neverVerifyPreloaded) VerificationRequired(_ string, pulledByProxy bool) bool {
	return pulledByProxy
}

// MayNeedVerification: the guard hides only what the proxy pulled, and
// among those only a repository with a restricted mapping, or with a pull
// in flight.
func (neverVerifyPreloaded) MayNeedVerification(repo string, mem RepoMemory) bool {
	return mem.PullInFlight(repo) || mem.Restricted(repo)
}

func (neverVerifyPreloaded) WhyNot(repo string) string {
	return "preloaded: the proxy never pulled it as " + orUnknown(repo)
}

func orUnknown(repo string) string {
	if repo == "" {
		return "(unknown repository)"
	}
	return repo
}
