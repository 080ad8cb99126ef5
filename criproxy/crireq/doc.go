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
//     the parts a decision needs (else InvalidArgument naming the field),
//     and a pull's auth as the registry check takes it (RegistryCredential:
//     the auth field decoded as the runtime decodes it).
//   - The runtime's answer: which image a name, an image ID or an ID prefix
//     stands for (Images, RuntimeImages over the runtime's ImageStatus),
//     and the repository it is known under (Resolve: "" for a lookup by ID,
//     or by a name the image is not listed under); the image ID a pull's
//     image_ref stands for (ImageID); whether an error is the runtime's
//     answer about a name or no answer at all (RuntimeAnswered: only the
//     first may be taken for "not an image of the node").
//   - What a client is told when the registry check refused a pull
//     (RegistryRefusal): the image as the pod named it and the registry's
//     short reason, never a credential or another tenant's image; the code
//     says whether to retry.
//
// It decides nothing and keeps no state.
package crireq
