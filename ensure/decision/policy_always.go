package decision

// alwaysVerify is AlwaysVerify: every image needs verification.
type alwaysVerify struct{}

func (alwaysVerify) Name() PolicyName                            { return AlwaysVerify }
func (alwaysVerify) VerificationRequired(string, bool) bool      { return true }
func (alwaysVerify) MayNeedVerification(string, RepoMemory) bool { return true }
func (alwaysVerify) WhyNot(string) string                        { return "" }
