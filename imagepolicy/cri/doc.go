// Package cri is image policy on the CRI path: the decisions ensure's
// guard asks of it (Gate, through ensure.ImagePolicy) and, on a proxy that
// does not enforce ensure, CRI hooks of its own (Hooks) that make the same
// decisions, so that every path by which an image reaches a container
// passes the same policy whether ensure is on or off.
//
// Contract:
//   - A pull is decided at each try, innermost (after credential
//     injection, with the credential the try goes with), on the manifest
//     digest the image's own registry names for the name, before the
//     runtime pulls; the runtime's image must then be that manifest's
//     config, else the pull is refused (Aborted: the tag moved in between),
//     and the verdict is bound to the image ID the pull produced. A pull by
//     image ID is left to CreateContainer.
//   - A container is decided for every image it would see (its image and
//     each image volume, by name, image ID or ID prefix) on the runtime's
//     answer: by the repository it is named and listed under, with the repo
//     digest the runtime recorded; known by ID, as each repository it is
//     listed under.
//   - An image no provider applies to is decided by the namespace's
//     noMatchPolicy on its name alone, with no question to the registry; a
//     namespace where nothing can refuse or be counted costs no registry
//     or runtime question at all.
//   - Fail closed: a registry that cannot be asked refuses the pull, and a
//     runtime that cannot say which image a name stands for refuses the
//     container (Unavailable), where a provider applies; a container's
//     image that is no image of the node (a checkpoint archive) is refused
//     where a provider applies.
//   - A refusal is the error the client sees: the image as the pod named it
//     and the policy's short reason for the pod (PermissionDenied); the
//     operator's reason is in the engine's log. Plugins are told the pod's
//     service account when the informer's cache holds the pod (Pods), for
//     their information: verdicts hold per namespace.
//   - Explain says what would be decided, running no plugin.
package cri
