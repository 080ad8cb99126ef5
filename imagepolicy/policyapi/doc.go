// Package policyapi is the image policy plugin API on the wire, for both
// sides: the proxy encodes an ImagePolicyRequest and decodes the plugin's
// ImagePolicyResponse; a plugin decodes the request and encodes its
// response. One version today, imagepolicy.cri-image-proxy.io/v1alpha1.
//
// Contract:
//   - JSON on stdin and stdout, one object each, decoded strictly (an
//     unknown or duplicate field is an error) and refused unless apiVersion
//     and kind are the expected ones: a response must be in the request's
//     apiVersion.
//   - A response says allowed (required, true or false), a reason for the
//     operator (at most MaxReason bytes) and a short one for the pod (at
//     most MaxPodReason bytes, one line), and may say how long the verdict
//     is cached (cacheDuration, not negative; absent: the provider's
//     configured duration for an allow or a deny).
//   - The request may hold the pull's registry credential; so may a
//     misbehaving plugin's output. Decoding errors say what is wrong and
//     never quote the input.
package policyapi
