package decision

// neverVerify is NeverVerify: any pod may use any image present on the
// node, as without KEP-2535.
type neverVerify struct{}

func (neverVerify) Name() PolicyName                            { return NeverVerify }
func (neverVerify) VerificationRequired(string, bool) bool      { return false }
func (neverVerify) MayNeedVerification(string, RepoMemory) bool { return false }
func (neverVerify) WhyNot(string) string                        { return "policy NeverVerify does not require verification" }
