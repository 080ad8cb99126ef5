// Command bench measures the proxy against the direct path, side by side in
// one run, on real components: containerd from the rig (package test/rig)
// and the cri-image-proxy binary as a separate process. It is run by
// `make bench` (root).
//
// Every scenario has two or more arms (direct, proxied, ...). Each round
// runs every arm once, back to back, in a rotating order; ratios are taken
// within a round and their median reported, which keeps the noise of a
// shared 2-core machine out of the comparison.
//
// The bench is a list of measurements (measurements.go), run in order: the
// scenarios, each of arms measured side by side, then the Go runtime
// settings, the fleet, pod start and the pod-start storm (a real kubelet
// given 110 pods at once, its CRI calls timed by a frame-forwarding tap in
// front of either arm, storm.go and tap.go). Each names what it needs of the
// environment beyond containerd and the pass-through proxy (the injection
// proxies, the ensure proxies, a kube-apiserver); -only NAME keeps those
// whose name contains NAME, and only what they need is set up.
//
// CPU per call is read from the kernel's per-process CPU clocks
// (CLOCK_PROCESS_CPUTIME of another pid), in nanoseconds, over all threads.
// The floor for a pass-through proxy is a bare gRPC server (a separate
// process answering Version from memory) plus its client: one full gRPC
// transaction, which is what a proxy adds.
package main
