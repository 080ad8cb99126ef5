// Package daemon assembles and runs cri-image-proxy serve: Run takes a
// validated configuration and runs until its context ends.
//
// Assembly (daemon.go) builds, in this order: the sockets systemd passed,
// the connection to the runtime, the Kubernetes API and the node's pods
// (kubernetes section), the credential injector (credentialProviders),
// the image policy engine (imagePolicy), ensure's guard over the records
// database with the image policy in it (ensure.go), or, ensure off, the
// image policy's own hooks with a registry check of their own, the reloader
// (reload.go), the CRI server on the proxy's socket, and the monitoring
// endpoints. Each part that runs is a component, a serve function and a
// stop function; every socket, listener and file opened is closed when
// Run returns, on one path, whether the daemon stopped or never started.
//
// Running: the components run under one errgroup. systemd is told READY=1
// once every socket accepts calls. The connection to the runtime is
// watched in the background (criproxy.Backend.Watch): re-made as soon as
// the runtime is back after a restart, with a log line when it goes away
// and one when it is back. The end of the context (SIGTERM,
// SIGINT) or a component's failure stops them all, the CRI server first:
// calls in flight get the shutdown timeout to finish.
//
// A records database that cannot be opened does not stop the daemon: the
// kubelet's runtime must stay up. The guard then fails closed (see
// ensure.UnavailableStore), /readyz fails, and there is no admin socket.
// One that opened but stops taking writes (a full disk) fails /readyz
// until it takes them again: the guard's garbage collection and its write
// probe (ensure.Guard.MendWrites) run in the background.
package daemon
