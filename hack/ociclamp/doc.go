// Command ociclamp runs an OCI runtime (runc) with the container's process
// asking no more than the caller holds: `ociclamp /usr/sbin/runc ARGS...`
// edits the bundle's config.json (create, run) or the --process file
// (exec), then execs the runtime. Three things are clamped:
//
//   - process.oomScoreAdj is raised to the caller's own oom_score_adj when
//     it asks for less. CRI-O asks -998 for a pod's infra container, and
//     lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which the
//     test VMs do not grant even to root: the runtime fails and no pod
//     starts. containerd has restrict_oom_score_adj for exactly this.
//   - process.capabilities lose what is not in the caller's bounding set.
//     CRI-O gives a privileged container every capability it knows,
//     CAP_SYS_RESOURCE included, and runc fails ("unable to apply caps");
//     containerd gives a privileged container the capabilities it holds
//     itself.
//   - linux.resources.hugepageLimits go when the hugetlb cgroup controller
//     is not mounted (these VMs): the kubelet gives every container some,
//     and runc fails them ("cannot set hugetlb limit"); containerd drops
//     them then (tolerate_missing_hugetlb_controller).
//
// CRI-O has no setting for either, so hack/build-crio.sh installs this
// wrapper as CRI-O's runtime for the rig. Raising a value or asking fewer
// capabilities never needs a privilege, so the clamped request always
// applies.
package main
