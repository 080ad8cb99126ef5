// Package credplugins runs the kubelet's credential provider exec plugins
// (KEP-2133) for the proxy and injects their credentials into pulls that
// carry none.
//
// Contract, matching the kubelet (pkg/credentialprovider/plugin, keyring.go)
// unless said otherwise:
//
//   - Configuration: LoadConfig reads a CredentialProviderConfig
//     (kubelet.config.k8s.io v1, v1beta1 or v1alpha1, the official types of
//     k8s.io/kubelet, strict decoding) from a file or a directory of
//     *.json/*.yaml/*.yml files in lexicographic order, and validates it with
//     the kubelet's rules, plus one: each plugin is an executable in the bin
//     directory. Every error names the file, the provider and the field.
//   - Matching: matchImages globs apply to domain labels only, one label per
//     glob, with as many labels on both sides; a port must match; the
//     pattern's path is a string prefix of the image's. Plugins receive the
//     normalized repository without tag or digest, as the kubelet sends it.
//   - Exec: the request on stdin in the provider's apiVersion; args and env
//     from the config, whose env overrides the host's; the response decoded
//     strictly and refused unless its apiVersion and kind match and its
//     cacheKeyType is Image, Registry or Global. stdout is bounded (1 MiB)
//     and stderr (64 KiB kept; logged at debug level only, its first KiB,
//     with the token sent, the passwords answered and anything shaped like
//     a token or an auth header masked; stdout is never logged); a timeout
//     (1 minute by default) kills the plugin's whole process group.
//   - Cache (package authcache): cacheDuration from the response, else the
//     provider's default, 0 = not cached; lookups image, then registry, then
//     global; one exec at a time per image; expired entries purged
//     periodically (Run); bounded.
//   - Injection (Injector.Tries, a pull's tries as a pullcred.Tries
//     sequence the caller loops over, ensure's Guard.Pull among them;
//     Injector.Pull, that loop with each try going to the runtime;
//     Injector.PullImage, Pull as a criproxy interceptor): a request with
//     its own auth is tried with it first, and the matching credentials
//     (see Lookup) follow only when that try fails, as the kubelet tries a
//     pod's secrets and then the node's; each is tried in order, username and password only,
//     server_address empty; no credential means an anonymous pull; when all
//     fail, the error lists provider, key and the runtime's message for each
//     try, with the runtime's last status code, and never a username or
//     password. The result says which credential succeeded (pullcred.Used).
//     A try the caller leaves unanswered, or a loop that breaks off, ends
//     the tries, and the pull fails.
//
// Credentials are never logged, put in errors or in metric labels.
package credplugins
