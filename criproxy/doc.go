// Package criproxy is a CRI v1 endpoint that forwards every call to a
// container runtime and lets interceptors extend any unary method.
//
// Contract:
//
//   - Every RuntimeService and ImageService method, and any method this
//     build does not know (a newer kubelet's), is served. Methods no
//     interceptor is on are forwarded as raw frames, never decoded: unary calls with
//     one Invoke, streams and unknown methods by pumping frames both ways.
//     Status codes, messages, details, headers, trailers and deadlines arrive
//     unchanged.
//   - Every unary CRI method can be intercepted: Intercept(m, handler),
//     where m is one of the typed Method values generated from the
//     cri-api's service descriptions (methods_gen.go: PullImage,
//     ImageStatus, CreateContainer, ...), so a handler of the wrong type
//     does not compile and a new interception point needs no change here.
//     A method is decoded only when an interceptor is on it;
//     InterceptFiltered lets it decline calls from the request alone
//     (ImageStatus on the kubelet's hot path).
//   - Local errors are mapped to gRPC status codes once, in the typed
//     handlers (ToStatus); runtime errors pass through as they came.
//   - Every call reaches the runtime as "application/grpc", as the
//     kubelet's and crictl's do, whichever path it took: CRI-O's socket
//     serves gRPC only for that content-type, judged on a connection's
//     first call.
//   - While the runtime (or a separate image endpoint) is away, calls fail
//     at once with Unavailable, their message saying which endpoint is
//     away, as the kubelet's own CRI client fails them: a caller's
//     WaitForReady does not travel on the wire, and the kubelet retries.
//     Backend.Watch reconnects as soon as it is back (gRPC's backoff, at
//     most 2s between attempts), whether it stopped, was killed or
//     recreated its socket, and logs each change once.
//   - Messages up to MaxMessageSize (16 MiB) pass both ways.
//   - Requests are never logged or put in metric labels: they may carry
//     registry credentials.
//
// The shape follows measurements on the target machines: a raw unary
// pass-through costs about one extra gRPC client+server transaction, while
// decoding and re-encoding a ListImages of 1000 images costs five times
// that.
package criproxy
