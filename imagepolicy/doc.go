// Package imagepolicy runs image policy plugins for the proxy: exec
// plugins, in the style of the kubelet's credential providers, that allow
// or refuse an image for a pod's namespace at PullImage (with the
// manifest digest resolved at the registry, before the runtime pulls) and
// at CreateContainer (for the container's image and each image volume,
// by image ID), so that signature and provenance policy holds for every
// path an image takes to a container: static pods, images already on the
// node, a tag moved after admission, a bare image ID.
//
// Contract:
//   - Configuration: LoadConfig reads an ImagePolicyConfig
//     (config.cri-image-proxy.io/v1alpha1) from a file or from a directory
//     of *.json/*.yaml/*.yml files in lexicographic order, strictly, and
//     validates it whole, each error naming the file, the provider and the
//     field. A provider has a name (its executable in the bin directory),
//     the plugin API version, matchImages (the kubelet's syntax), the
//     namespaces it applies to ("*" for all), a timeout (30s), a
//     failurePolicy (Fail, the default, or Ignore), how long an allow (1h)
//     and a deny (1m) are cached, whether it receives the pull's registry
//     credential (sendCredentials), args and env, and the plugin's own
//     files to watch (watchFiles; absent: the absolute file paths among
//     its args). A noMatchPolicy says per namespace what happens to an
//     image no provider applies to: Allow (the default), Warn or Deny.
//   - Which providers apply: those whose namespaces hold the subject's
//     namespace (the pod's, else defaultNamespace) and whose matchImages
//     match its repository as the runtime reaches it (keyring's
//     ReachedPattern: a host's case, a default port 443 or 80, an IP
//     literal's spelling do not matter; the kubelet's rule, which credential
//     providers keep, would let such spellings through); an image known by
//     ID only gets every provider of its namespace. All that apply must
//     allow, asked in order up to the first refusal. None applying: the
//     namespace's noMatchPolicy decides (Warn allows, logs a warning and
//     counts it; Deny refuses), with no digest needed.
//   - Plugins are told the repository in its canonical form (host
//     case-folded, IP literal canonical, port kept), and verdicts are
//     cached under it: spellings of one host share them.
//   - Exec (package policyapi on the wire, execplugin for the
//     bounds): the request on stdin, the verdict on stdout, strictly
//     decoded; the same bounds as credential plugins (timeout, 1 MiB of
//     stdout, the process group killed). stderr is logged at debug level
//     only, capped and masked.
//   - failurePolicy: a crash, a hang, too much output, garbage or another
//     apiVersion refuses under Fail (the cause in the log and the
//     operator's reason, a short reason for the pod) and allows under
//     Ignore; a fault is never cached.
//   - Cache: per provider, per (image ID or manifest digest, repository,
//     namespace) (a plugin may decide per repository), for the provider's
//     allow or deny duration or the verdict's own cacheDuration; one
//     plugin run at a time per image, repository and namespace: a verdict
//     holds for a namespace, not a pod. Reload drops every cached
//     verdict; FileChanged (the daemon watches the directories WatchedDirs
//     names) drops a provider's when one of its watchFiles changes, and a
//     verdict its plugin was making across the change is neither cached
//     nor bound. Bind carries a pull's verdict over to the image ID the pull
//     produced.
//   - Observability: a debug decision log line per Decide, an info line
//     per refusal, a warning per plugin fault; metrics by provider, call,
//     result and source; Explain says what would be decided without
//     running a plugin.
//
// The pull's credential goes to plugins with sendCredentials only and is
// never logged, put in an error or a metric label.
//
// The files by role: subject.go what a decision is about; verdict.go the
// decisions and their account; provider.go a provider, its cache and its
// plugin runs; engine.go the Engine over them; config.go the
// ImagePolicyConfig; exec.go and metrics.go its kind of exec plugin;
// watch.go the watched files; explain.go Explain.
package imagepolicy
