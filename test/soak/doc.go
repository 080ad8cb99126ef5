// Command soak runs the proxy as a node runs it, under hours of churn, and
// checks that nothing in it grows: `make soak` (30 minutes; SOAK=2h make
// soak for longer). It needs root and what `make deps` installs (the rig:
// a private containerd, the registries, crictl). It is not part of `make
// test`, nor of CI.
//
// # What runs
//
// One rig (test/rig): containerd (or CRI-O, RUNTIME=crio), the
// authenticated registry and its anonymous view, on loopback. One proxy
// binary, built from this tree, as in production: ensure on (KEP-2535)
// with its records database prefilled to -records (100,000) records, the
// docker-config-credential-provider plugin injecting a node credential for
// registry.rig.test, the registry check on, the clean-up (gcInterval,
// gracePeriod) shortened to -gc-interval and -grace-period so that it runs
// many times, its metrics on a loopback port, log level info.
//
// The prefilled records are of images that are not on the node, dated a
// year ahead: the clean-up drops the records of absent images last updated
// before the grace period, so it scans these on every run and keeps them.
// The database holds -records records throughout, and each must still be
// there at the end.
//
// The load, bounded in time (-duration) and loopback only: four tenants,
// one worker each, each with its own -images/4 images (busybox plus a
// marker layer: one shared base layer, pushed at setup):
//
//   - alice and bob pull with credentials in the request (private: their
//     images must be hidden from every pod not verified for them);
//   - plugin pulls registry.rig.test/... with none: the proxy injects the
//     plugin's credential (node-wide);
//   - anon pulls from the anonymous registry with none (public).
//
// Each step of a worker is a kubelet's: ImageStatus, then PullImage with
// the pod's sandbox config when not shown, a container created, started,
// stopped and removed in the tenant's pod; and a re-use of an image it
// pulled before (the verified re-use answered from the node). Pods are
// replaced every few steps. A tenant keeps at most -window images on the
// node: the oldest is removed by ID, in turn through the proxy
// (RemoveImage, which drops its record) and directly on the runtime (as
// the kubelet's image GC around the proxy would; the clean-up drops its
// record after the grace period). The images cycle: every one is pulled
// many times over a 30-minute run. The proxy is sent SIGHUP every
// -reload-every (its credential provider configuration alternating
// between two cache durations, so that each reload applies a change), and
// the runtime is stopped and started again every -restart-every, the
// load going on meanwhile (its calls fail and are counted, as a kubelet's
// would).
//
// # What is sampled
//
// Every -interval: the proxy's RSS (/proc/PID/status), goroutines and open
// descriptors (its /metrics: go_goroutines, process_open_fds), the
// database file's size, its records (cri_image_proxy_ensure_ondisk_
// pulledrecords) and the images whose layers it knows. The daemon has no
// metric of the layers it knows: the soak copies the database file and
// counts its layers bucket (and what every bucket holds, for the bound on
// the size). Intents, pod grants and the Go heap are sampled too, for
// the plot. A light leak check (a pod without credentials against a few of
// each private tenant's images) runs at each sample.
//
// # Targets
//
// At the end, each is checked and the run exits non-zero with a report of
// those missed:
//
//   - Flat: after the warm-up (-warmup, 5 minutes), each of RSS,
//     goroutines, open descriptors, database size, records and layers known
//     drifts by at most -tolerance (5%) of its mean: the Theil-Sen slope of
//     the samples after the warm-up (the median of the slopes between every
//     two of them), times the time they span, divided by their mean. A trend
//     over the whole window is what a leak is; a median slope is not moved
//     by the few samples that land in a runtime restart or a garbage
//     collection, where a last-versus-first comparison would be.
//   - The database's size is bounded by what it holds: at most twice the
//     bytes its buckets' pages take, plus one bbolt allocation step (16
//     MiB).
//   - No record lost: every prefilled record is still there; every image a
//     tenant pulled through the proxy and that is still on the node has its
//     record, with the tenant's credential (alice, bob) or node-wide (plugin,
//     anon); no image removed through the proxy, or removed longer ago than
//     the grace period and two clean-up runs, has a record left.
//   - No image leaked: the e2e tests' assertions (test/e2e cutpull_test.go,
//     ensure_test.go), for every private image on the node: a new pod
//     without credentials is not shown it (ImageStatus by name) and is
//     refused a container of it (PermissionDenied) by name, by ID and by ID
//     prefix; so is the other private tenant's last pod, which holds grants
//     of its own.
//   - No panic: the proxy never exited, and its log has no panic or fatal
//     error.
//   - The images cycled: on a run of 30 minutes or more, every image was
//     pulled through the proxy at least once, and at least -images pulls
//     went to the registry (not answered from the node).
//
// A run shorter than 3 warm-ups takes a third of the run as its warm-up,
// samples at least 20 times, and restarts the runtime once, half-way, when
// -restart-every would not: the figures of a short run are indicative.
//
// # Output
//
// In -out (_output/soak): soak.csv (one row per sample), soak.svg (one
// panel per series, the warm-up shaded, each asserted series with its
// fitted line and the ±tolerance band around its mean), soak.md (the
// figures, the targets and whether each was met) and proxy.log.
package main
