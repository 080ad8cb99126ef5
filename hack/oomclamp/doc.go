// Command oomclamp runs an OCI runtime (runc, crun) with the container's
// process.oomScoreAdj raised to the caller's own oom_score_adj when it asks
// for less: `oomclamp /usr/bin/crun ARGS...` edits the bundle's config.json
// (create, run) or the --process file (exec), then execs the runtime.
//
// Why: CRI-O asks -998 for a pod's infra container, and lowering a
// process's oom_score_adj needs CAP_SYS_RESOURCE, which the test VMs do not
// grant even to root: the runtime fails and no pod starts. containerd has
// restrict_oom_score_adj for exactly this; CRI-O has no such setting, so
// hack/build-crio.sh installs this wrapper as CRI-O's runtime for the rig.
// Raising a value never needs a capability, so the clamped value always
// applies.
package main
