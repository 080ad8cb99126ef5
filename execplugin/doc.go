// Package execplugin is the proxy's exec plugin framework, under its two
// kinds of plugins (credential providers and image policy providers):
// what every kind does alike, written once; each kind adds its own
// semantics (what a request and an answer are, what a cache entry is keyed
// on, how providers are matched, what a reload keeps).
//
// Contract:
//   - Configuration (LoadConfig): a path is a file, or a directory's
//     *.json, *.yaml and *.yml files in lexicographic order (ConfigFiles),
//     as the kubelet reads --image-credential-provider-config. Each file
//     goes to the kind's decoder, which is strict (DecodeStrict: an
//     unknown, misspelt or duplicate field is an error). Every error is
//     reported at once, prefixed with the kind's configuration, the file
//     and the provider, and names its field path; a provider name declared
//     twice names both files. The configuration's hash is its files'
//     contents, in order.
//   - Validation (ValidateEntry): the rules every provider entry follows,
//     the kubelet's for a credential provider: a name that is an
//     executable in the bin directory, a supported apiVersion, valid
//     matchImages, env names.
//   - Runs (Run, Exec): the request on stdin in the provider's apiVersion,
//     the answer on stdout decoded strictly in that same apiVersion; args
//     and env from the configuration, appended after the host's
//     environment so that the configuration's variables win
//     (https://github.com/kubernetes/kubernetes/issues/102750), in a
//     process group of its own. A
//     timeout (DefaultTimeout when 0) or the caller's context kills the
//     whole process group, children included. stdout is bounded
//     (DefaultMaxStdout, 1 MiB): past it the plugin is killed and the run
//     fails with ErrOutputLimit; stderr is kept up to DefaultMaxStderr
//     (64 KiB) and never fails the run. Errors name the plugin and wrap
//     ErrTimeout, ErrOutputLimit or ErrFailed (a non-zero exit, a signal,
//     an executable that cannot be started); they never quote stdout,
//     which may hold credentials.
//   - Calls (Plugin.Call): each run timed and counted by result (success,
//     failed, timeout, invalid_response, output_too_large); stderr logged
//     at debug level only, capped (ForLog), with the call's secrets and
//     anything shaped like a token or an auth header masked.
//   - Caches: one per provider (package authcache: keyed entries with an
//     expiry, bounded), purged periodically (Host.Run, on
//     internal/periodic), their entries gauged and, where the kind counts
//     them, their lookups and evictions counted.
//   - Reload: a Host holds the current provider set and swaps it
//     atomically (Install); a caller that loaded a set finishes with it.
//     The config info metric shows the installed configuration's hash.
//   - Metrics keep each kind's names and labels (Kind): dashboards and
//     alerts read them. Labels are provider names and fixed words, never
//     images or credentials.
package execplugin
