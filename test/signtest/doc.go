// Package signtest signs images in a registry as cosign does, for tests
// only: with a key it generates (Key) or keylessly with sigstore-go's test
// signing authority (Authority: a virtual Fulcio, Rekor and timestamp
// authority whose trusted root it writes), and pushes the signature next
// to the image in one of cosign's two layouts:
//   - TagConvention: a manifest at <repo>:sha256-<hex>.sig whose layers are
//     simple signing payloads carrying the signature, certificate, Rekor
//     bundle and RFC 3161 timestamp as annotations (cosign before v3; any
//     registry, Debian's docker-registry 2.8 included);
//   - Referrer: a sigstore bundle (a DSSE envelope of an in-toto statement
//     of predicate type https://sigstore.dev/cosign/sign/v1 whose subject
//     is the image's digest) as an OCI 1.1 referrer of the image (cosign
//     v3), through the referrers API or, on a registry without it, the
//     referrers tag sha256-<hex>.
//
// The keys and the authority live in memory for one test; nothing signed
// here means anything outside it.
package signtest
