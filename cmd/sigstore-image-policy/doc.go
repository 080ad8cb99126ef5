// Command sigstore-image-policy is the reference image policy plugin of
// cri-image-proxy (imagepolicy.cri-image-proxy.io/v1alpha1): it allows an
// image for a namespace when a cosign signature of its manifest digest
// verifies against one of the authorities the namespace's policy names,
// and refuses it otherwise, saying why.
//
// Contract:
//   - One request on stdin, one response on stdout, exit 0 for a verdict
//     (allow or deny); a request it cannot read exits non-zero, which the
//     proxy's failurePolicy handles. Diagnostics go to stderr.
//   - The policy file (--policy; config.cri-image-proxy.io/v1alpha1
//     SigstoreImagePolicy) is read at every run, strictly, and validated
//     whole: per-namespace policies (namespaces, images in the kubelet's
//     matchImages syntax matched as the proxy matches them, every spelling
//     of a host that host, authorities: public keys, or keyless identities
//     and issuers checked against an offline trusted root), registry
//     endpoints and CA files (a registry's entry found under any spelling
//     of its host). The first policy covering the pod's
//     namespace and the image's repository decides; no policy refuses.
//   - Signatures are found at the image's own registry (or the endpoint
//     the policy names for it), with the pull's credential when the proxy
//     sends one: the cosign tag sha256-<hex>.sig (simple signing layers,
//     cosign before v3) and the image's OCI referrers (sigstore bundles
//     of predicate https://sigstore.dev/cosign/sign/v1, cosign v3; the
//     referrers API, else the referrers tag). Reads are bounded in count
//     and size. No network but the registry: the trusted root is a file.
//   - Verification is sigstore-go's: the signature, the certificate chain
//     to the trusted root's Fulcio at the time a transparency log entry or
//     a timestamp authority vouches for, the identity, the transparency
//     log entry (required for keyless by default, optional for keys),
//     SCTs (required for keyless by default); then that the signed
//     payload names the image's digest.
//   - A registry that cannot be read refuses with cacheDuration 0 (asked
//     again at the next call); the registry's credential never appears in
//     an answer or a log.
package main
