// Package criproxy is a CRI v1 endpoint that forwards every call to a
// container runtime and lets hooks intercept the image path.
//
// Contract:
//
//   - Every RuntimeService and ImageService method, and any method this
//     build does not know (a newer kubelet's), is served. Methods no hook
//     intercepts are forwarded as raw frames, never decoded: unary calls with
//     one Invoke, streams and unknown methods by pumping frames both ways.
//     Status codes, messages, details, headers, trailers and deadlines arrive
//     unchanged.
//   - Six methods can be intercepted by hooks (see PullImageHook and its
//     siblings): ImageService PullImage, ImageStatus, RemoveImage and
//     ListImages; RuntimeService CreateContainer and RemovePodSandbox. They
//     are decoded only when a hook implements them.
//   - Local errors are mapped to gRPC status codes once, in the typed
//     handlers (ToStatus); runtime errors pass through as they came.
//   - Messages up to MaxMessageSize (16 MiB) pass both ways.
//   - Requests are never logged or put in metric labels: they may carry
//     registry credentials.
//
// The shape follows measurements on the target machines: a raw unary
// pass-through costs about one extra gRPC client+server transaction, while
// decoding and re-encoding a ListImages of 1000 images costs five times
// that.
package criproxy
