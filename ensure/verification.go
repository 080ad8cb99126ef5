package ensure

import "github.com/cri-image-proxy/cri-image-proxy/ensure/decision"

// What a decision is explained by is package decision's vocabulary (the
// records commands and the admin API speak it without ensure); these are
// its names in the guard's API.
type (
	// Explanation says what the guard decides for an image and a pod.
	Explanation = decision.Explanation
	// Verification is the registry's word on one recorded credential.
	Verification = decision.Verification
	// RegistryVerification is the registry's own word on the credential a
	// pull went with: Verify returns it to Pull, which records with it.
	RegistryVerification = decision.RegistryVerification
	// PolicyExplanation is what the image policy would decide for an
	// image used by a container of a namespace.
	PolicyExplanation = decision.PolicyExplanation
	// PolicyDecidedAs is the image decided as one repository.
	PolicyDecidedAs = decision.PolicyDecidedAs
)

// MaxListedBlobs bounds RegistryVerification.CheckedBlobs.
const MaxListedBlobs = decision.MaxListedBlobs
