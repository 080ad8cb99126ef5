#!/usr/bin/env bash
# build-crio.sh: build CRI-O, its pinns helper, the CNI plugins its pod
# networks need and the runtime wrapper (hack/ociclamp) from the Go module
# proxy into $TOOLS_DIR/crio-$CRIO_VERSION, where test/rig finds them
# (RUNTIME=crio), with the runc the containerd 2.x legs run. conmon comes
# from Debian (install-deps.sh).
# What is already built for these versions is kept: a machine builds it
# once. Cold (empty module and build caches) on this 2-core machine: 251 s
# (CRI-O 214 s, CNI plugins 17 s, runc 19 s; 7.3 minutes of CPU) with
# other work beside it, 16.5 minutes while kube-apiserver built beside it.
#
# Why from source: Debian 12 has no CRI-O; its Go module is served at exact
# versions only (v1.35.2; not the version list), and one dependency,
# go-criu/v8 at v8.1.0, is refused: it is replaced by v8.0.0, which builds
# (checkpoint/restore stays off, as nothing here uses it).
#
# What is in the directory:
#   crio, pinns      CRI-O and the helper that pins a pod's namespaces
#   ociclamp         runs an OCI runtime with the process asking no more than
#                    the caller holds: these VMs lack CAP_SYS_RESOURCE, and
#                    CRI-O asks oom_score_adj -998 for the infra container and
#                    every capability for a privileged one, and the kubelet
#                    hugepage limits these VMs have no controller for
#                    (hack/ociclamp)
#   runc.real        runc $RUNC_VERSION (seccomp), as build-containerd.sh
#                    builds it: the runc of the containerd 2.x legs, so that
#                    a difference between the legs is the runtimes'; with
#                    Debian's 1.1.5 critest ran 6 specs fewer (93 of 113)
#   runc             a two-line script: runc.real through ociclamp, CRI-O's
#                    runtime. Not crun, CRI-O's upstream default: Debian 12's
#                    crun 1.8.1 refuses the runtime-spec 1.3 bundles CRI-O
#                    1.35 writes.
#   cni/             loopback, bridge, host-local (containernetworking/plugins)
#
# Env: TOOLS_DIR, CRIO_VERSION (v1.35.2), CNI_PLUGINS_VERSION (v1.10.0: the newest the module
# proxy serves; it needs Go 1.26.8, this machine's), RUNC_VERSION (v1.4.3, build-containerd.sh's).
set -euo pipefail
TOOLS_DIR=${TOOLS_DIR:-/var/cache/cri-image-proxy/tools}
CRIO_VERSION=${CRIO_VERSION:-v1.35.2}
CNI_PLUGINS_VERSION=${CNI_PLUGINS_VERSION:-v1.10.0}
RUNC_VERSION=${RUNC_VERSION:-v1.4.3}
export PATH=/usr/local/go/bin:$PATH GOFLAGS=-modcacherw
log() { echo "[build-crio] $*" >&2; } # stdout is the directory alone
repo=$(cd "$(dirname "$0")/.." && pwd)

OUT=$TOOLS_DIR/crio-$CRIO_VERSION
# Each part is rebuilt only when what it was built from changed: its stamp
# names the version (the wrapper: a hash of its source and of this script,
# which writes the runc script; rebuilding it takes a second).
ociclamp_sum=$(cat "$repo"/hack/ociclamp/*.go "$0" | sha256sum | cut -c1-16)
fresh() { # fresh STAMP VALUE BINARY...: the binaries exist and were built from VALUE
	local stamp=$1 value=$2 b
	shift 2
	for b in "$@"; do [ -x "$OUT/$b" ] || return 1; done
	[ "$(cat "$OUT/$stamp" 2>/dev/null)" = "$value" ]
}
need_crio=true need_cni=true need_runc=true need_wrapper=true
fresh crio.version "$CRIO_VERSION" crio pinns && need_crio=false
fresh cni.version "$CNI_PLUGINS_VERSION" cni/loopback cni/bridge cni/host-local && need_cni=false
fresh runc.version "$RUNC_VERSION" runc.real && need_runc=false
fresh ociclamp.sum "$ociclamp_sum" ociclamp runc && need_wrapper=false
if ! $need_crio && ! $need_cni && ! $need_runc && ! $need_wrapper; then
	echo "$OUT"
	exit 0
fi
for c in conmon gcc make pkg-config; do
	command -v "$c" >/dev/null || { echo "build-crio: $c missing: run hack/install-deps.sh (as root)" >&2; exit 1; }
done
mkdir -p "$OUT/cni"

# moddir MODULE@VERSION NAME NOSUMDB: a writable copy of a module's source.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
moddir() {
	local dir
	dir=$(GONOSUMDB=$3 go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "build-crio: could not download $1" >&2; exit 1; }
	mkdir -p "$src/$2"
	cp -r "$dir/." "$src/$2" && chmod -R u+w "$src/$2"
	echo "$src/$2"
}
t0=$(date +%s)
last=$t0
step() { # step WHAT: log WHAT with the seconds the step before it took
	local now
	now=$(date +%s)
	log "$1 (previous step $((now - last))s)"
	last=$now
}

if $need_crio; then
	step "building CRI-O $CRIO_VERSION into $OUT (about 4 minutes on 2 cores with a cold Go cache, 15 on a busy machine)"
	rm -f "$OUT/crio.version"
	c=$(moddir "github.com/cri-o/cri-o@$CRIO_VERSION" cri-o github.com/cri-o/cri-o)
	(
		cd "$c"
		go mod edit -replace github.com/checkpoint-restore/go-criu/v8=github.com/checkpoint-restore/go-criu/v8@v8.0.0
		# go.sum gets the replacement's lines from the checksum database.
		sed -i '\#^github.com/checkpoint-restore/go-criu/v8 #d' go.sum
		go mod download github.com/checkpoint-restore/go-criu/v8
		GOFLAGS=-mod=mod go list -deps ./cmd/crio >/dev/null
		# Tags as CRI-O's Makefile sets them on a machine without btrfs,
		# devicemapper, ostree or gpgme headers; seccomp with libseccomp-dev.
		tags="containers_image_ostree_stub exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper containers_image_openpgp seccomp"
		go build -trimpath -tags "$tags" -ldflags "-s -w -X github.com/cri-o/cri-o/internal/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" -o "$OUT/crio.new" ./cmd/crio
	)
	step "building pinns"
	make -s -C "$c/pinns" >/dev/null
	cp "$c/bin/pinns" "$OUT/pinns.new"
	mv "$OUT/crio.new" "$OUT/crio"
	mv "$OUT/pinns.new" "$OUT/pinns"
	echo "$CRIO_VERSION" >"$OUT/crio.version"
fi

if $need_cni; then
	step "building the CNI plugins $CNI_PLUGINS_VERSION (loopback, bridge, host-local)"
	rm -f "$OUT/cni.version"
	p=$(moddir "github.com/containernetworking/plugins@$CNI_PLUGINS_VERSION" cni-plugins "")
	for b in main/loopback main/bridge ipam/host-local; do
		(cd "$p" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/cni/$(basename $b)" "./plugins/$b")
	done
	echo "$CNI_PLUGINS_VERSION" >"$OUT/cni.version"
fi

if $need_runc; then
	step "building runc $RUNC_VERSION (seccomp)"
	rm -f "$OUT/runc.version"
	r=$(moddir "github.com/opencontainers/runc@$RUNC_VERSION" runc "")
	(cd "$r" && go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" -o "$OUT/runc.real.new" .)
	mv "$OUT/runc.real.new" "$OUT/runc.real"
	echo "$RUNC_VERSION" >"$OUT/runc.version"
fi

if $need_wrapper; then
	step "building the runtime wrapper (hack/ociclamp)"
	rm -f "$OUT/ociclamp.sum"
	(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/ociclamp.new" ./hack/ociclamp)
	mv "$OUT/ociclamp.new" "$OUT/ociclamp"
	printf '#!/bin/sh\n# runc through ociclamp (hack/build-crio.sh says why)\nd=$(dirname "$0")\nexec "$d/ociclamp" "$d/runc.real" "$@"\n' >"$OUT/runc.new"
	chmod 0755 "$OUT/runc.new"
	mv "$OUT/runc.new" "$OUT/runc"
	echo "$ociclamp_sum" >"$OUT/ociclamp.sum"
fi

step "built in $(($(date +%s) - t0))s: $("$OUT/crio" --version 2>/dev/null | head -1), $(conmon --version | head -1), $("$OUT/runc.real" --version | head -1)"
echo "$OUT"
