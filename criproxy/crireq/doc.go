// Package crireq says what a CRI request names, in the plain terms of the
// code that decides on it (ensure's guard, image policy's hooks), and what
// the runtime answers for an image: written once, so that both read a
// request alike.
//
// Contract:
//   - A request: the pod a sandbox config names (PodOf: namespace, name,
//     UID, and static from the kubelet's config.source annotation; no
//     config is no pod), an image spec as an ImageQuery (QueryOf), every
//     image a CreateContainer would show its container (ContainerImages:
//     its image and each image volume's, KEP-4639) once CreateShape found
//     the parts a decision needs (else InvalidArgument naming the field).
//   - The runtime's answer: which image a name, an image ID or an ID prefix
//     stands for (Images, RuntimeImages over the runtime's ImageStatus),
//     and the repository it is known under (Resolve: "" for a lookup by ID,
//     or by a name the image is not listed under); the image ID a pull's
//     image_ref stands for (ImageID); whether an error is the runtime's
//     answer about a name or no answer at all (RuntimeAnswered: only the
//     first may be taken for "not an image of the node").
//   - Whether the runtime pulled the image the registry answered
//     (PulledAsAnswered), else the pull's Aborted error.
//
// What a pod is told when the registry check refused its pull, and a
// pull's auth as the check takes it, are the registry package's
// (registry.Refusal, registry.CredentialOf): crireq imports no registry.
//
// It decides nothing and keeps no state.
package crireq
