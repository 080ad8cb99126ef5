#!/usr/bin/env bash
# build-containerd.sh: build containerd 2.x, its runc shim and runc from the
# Go module proxy into $TOOLS_DIR/containerd-$CONTAINERD_VERSION, where the e2e
# rig, the node tests, the demo and the bench find them (test/rig: Runtime).
# A directory already complete is kept: a machine builds each version once
# (about 20 minutes on 2 cores with a cold Go cache for the first, a few
# minutes for another minor whose dependencies are mostly the same).
#
# Why from source: Debian ships containerd 1.6, which upstream ended; nodes run
# 2.2 and 2.3 (the long-term release), and those that follow containerd's
# releases run 2.4. 2.3.0-2.3.3 cannot start a pod whose sandbox image is
# pinned by digest, so the default is the newest 2.3 patch the module proxy
# serves; hack/install-deps.sh builds the newest 2.4 patch too.
#
# runc: the newest 1.4 patch, for every containerd line. containerd 2.3's own
# CI pins runc 1.5 and 2.4's 1.5.1, but these machines run cgroup v1, which
# runc 1.5 only keeps for compatibility; 1.4 is the line the 2.3 release notes
# support and the one verified here with 2.3 and 2.4, and one runc for both
# keeps a difference between the legs containerd's. Built with the seccomp tag
# (libseccomp-dev): without it every kubelet pod sandbox fails with
# "seccomp: config provided but seccomp not supported".
#
# Env: TOOLS_DIR, CONTAINERD_VERSION (v2.3.7), RUNC_VERSION (v1.4.3).
set -euo pipefail
TOOLS_DIR=${TOOLS_DIR:-/var/cache/cri-image-proxy/tools}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}
RUNC_VERSION=${RUNC_VERSION:-v1.4.3}
export PATH=/usr/local/go/bin:$PATH GOFLAGS=-modcacherw
log() { echo "[build-containerd] $*" >&2; } # stdout is the directory alone

OUT=$TOOLS_DIR/containerd-$CONTAINERD_VERSION
if [ -x "$OUT/containerd" ] && [ -x "$OUT/containerd-shim-runc-v2" ] && [ -x "$OUT/runc" ] &&
	[ "$(cat "$OUT/runc.version" 2>/dev/null)" = "$RUNC_VERSION" ]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT"

# moddir MODULE@VERSION: a writable copy of a module's source.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
moddir() {
	local dir
	dir=$(go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "build-containerd: could not download $1" >&2; exit 1; }
	mkdir -p "$src/$2"
	cp -r "$dir/." "$src/$2" && chmod -R u+w "$src/$2"
	echo "$src/$2"
}

start=$(date +%s)
log "building containerd $CONTAINERD_VERSION into $OUT (about 15 minutes on a cold Go cache)"
c=$(moddir "github.com/containerd/containerd/v2@$CONTAINERD_VERSION" containerd)
v=${CONTAINERD_VERSION#v}
cldf="-s -w -X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
(cd "$c" && go build -trimpath -tags no_btrfs -ldflags "$cldf" -o "$OUT/containerd.new" ./cmd/containerd)
(cd "$c" && CGO_ENABLED=0 go build -trimpath -ldflags "$cldf" -o "$OUT/containerd-shim-runc-v2.new" ./cmd/containerd-shim-runc-v2)

log "building runc $RUNC_VERSION (seccomp)"
r=$(moddir "github.com/opencontainers/runc@$RUNC_VERSION" runc)
rv=${RUNC_VERSION#v}
(cd "$r" && go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=$rv" -o "$OUT/runc.new" .)

for b in containerd containerd-shim-runc-v2 runc; do mv "$OUT/$b.new" "$OUT/$b"; done
echo "$RUNC_VERSION" >"$OUT/runc.version"
log "built in $(($(date +%s) - start))s: $("$OUT/containerd" --version); $("$OUT/runc" --version | head -1)"
echo "$OUT"
