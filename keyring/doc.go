// Package keyring reads registry credentials as the kubelet's keyring does
// (pkg/credentialprovider: keyring.go, config.go), apart from the exec
// plugins that also answer them:
//   - docker config.json ("auths") and legacy .dockercfg files: the
//     content of kubernetes.io/dockerconfigjson and dockercfg pull secrets,
//     and of a node's config.json. Entries are username/password or "auth"
//     (base64 user:password); parse errors name the entry and never quote
//     the content, which holds passwords;
//   - matching: a key or a provider's matchImages pattern against an image
//     (host labels with globs, an optional port that must match, a path
//     prefix), and the normalization of keys (scheme and /v1/ stripped);
//   - matching as the runtime reaches registries, for image policy
//     (ReachedPattern, CanonicalRepository): hosts case-folded, IP literals
//     canonical, 443 and 80 the same as no port. Credential providers keep
//     the kubelet's letter-for-letter rule, which fails closed for them (a
//     spelling it misses gets no credential); for a policy the same miss
//     would let an image run unchecked;
//   - Serving: which entries serve an image, the kubelet's keyring's one
//     rule for docker config files, pull secrets and plugin answers alike:
//     the keys that match it, else, for a Docker Hub image, Docker Hub's
//     key ("https://index.docker.io/v1/", as docker login writes it).
//
// It is tenant input for ensure (a pod's pull secrets) and node input for
// credplugins; both import it, and neither the other for it.
package keyring
