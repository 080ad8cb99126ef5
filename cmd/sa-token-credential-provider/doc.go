// Command sa-token-credential-provider is a credential provider plugin for
// tests of service-account tokens (KEP-4412): it checks the token the
// kubelet, or cri-image-proxy, hands it, and maps a service account
// annotation to registry credentials.
//
//	sa-token-credential-provider --for-tests-only --audience AUD --credentials FILE \
//	    [--annotation registry.test/user] [--user-for-pod POD=USER]... \
//	    [--cache-duration D] [--log FILE]
//
// Never deploy it: it does not verify the token's signature, so any
// well-formed token, forged by anyone, gets registry credentials. It refuses
// to run without --for-tests-only.
//
// It reads a credentialprovider.kubelet.k8s.io/v1 CredentialProviderRequest
// and checks the token's claims: the audience, not expired, not before its
// time, bound to a pod (kubernetes.io.pod.name and uid). It does not check
// the signature: a real plugin exchanges the token with a service that
// does. The annotation's value names a user of FILE (lines user:password),
// whose credentials it answers for the image's registry, cacheKeyType
// Registry; --user-for-pod names another user for the token of the pod
// named POD (the pods of one account then get different credentials, so a
// test can tell whose token a credential was minted for), and
// --cache-duration answers that cacheDuration (0s: not cached). With --log
// it appends one JSON line per request with the claims it saw, never the
// token.
package main
