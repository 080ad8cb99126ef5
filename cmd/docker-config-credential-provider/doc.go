// Command docker-config-credential-provider is a kubelet credential
// provider plugin (KEP-2133) that answers from a docker config.json file:
// node-wide credentials kept in a file, for cri-image-proxy or the kubelet
// itself.
//
//	docker-config-credential-provider [--docker-config FILE]
//
// It reads a CredentialProviderRequest (credentialprovider.kubelet.k8s.io
// v1, v1beta1 or v1alpha1) on stdin and answers in the same version with
// the entries of FILE's "auths" whose key matches the requested image, by
// the kubelet's rules: for a Docker Hub image no key matches, docker
// login's key (https://index.docker.io/v1/). cacheKeyType is Registry only
// when no key of FILE is narrower than the image's registry
// (registry.test/team-a beside registry.test), else Image: a Registry
// answer serves every later image of the registry without a run, and would
// hide the narrower key's credential from its images. cacheDuration is
// left to the provider's defaultCacheDuration. Credentials may be given as
// username and password or as "auth" (base64 of user:password).
//
// Errors go to stderr and exit 1; they never quote the file's content.
package main
