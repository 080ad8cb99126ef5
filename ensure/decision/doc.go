// Package decision holds the rules ensure decides by, apart from its
// state: the kubelet's image pull credentials verification policies
// (Policy, one type per policy, made by NewPolicy from one table and
// validated by ValidatePolicy, with the kubelet's names), and the expiry
// of verified credentials (Expiry, per repository; CredentialAges says how
// old each credential of a record is), and what a decision is explained by
// (Explanation, Verification, PolicyExplanation), which ensure fills in.
// It reads nothing itself: a policy is handed the guard's memory
// (RepoMemory), the ages a store's verification times. The configuration,
// the records commands, bake and the admin API import it rather than all
// of ensure.
package decision
