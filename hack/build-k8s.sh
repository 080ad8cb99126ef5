#!/usr/bin/env bash
# build-k8s.sh [--module DIR] [COMPONENT...]: build Kubernetes components for
# the e2e tests from the Go module proxy, into $TOOLS_DIR/k8s-$VERSION. The
# module (hack/k8s by default: the current k8s.io/kubernetes and the etcd it
# pins; hack/k8s-old: the old kubelet) fixes the version. A binary already
# there is kept: a machine builds each once (6-11 minutes for kube-apiserver
# on 2 cores with a cold Go cache, seconds when warm).
#
# COMPONENT: kube-apiserver, etcd, kubelet (default: kube-apiserver etcd).
set -euo pipefail
module=k8s
if [ "${1:-}" = --module ]; then
	module=${2:?--module needs a directory under hack/}
	shift 2
fi
cd "$(dirname "$0")/$module"
export PATH=/usr/local/go/bin:$PATH
TOOLS_DIR=${TOOLS_DIR:-/var/cache/cri-image-proxy/tools}
V=$(sed -n 's/^\(require \)\{0,1\}[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\2/p' go.mod | head -1)
[ -n "$V" ] || { echo "build-k8s: no k8s.io/kubernetes version in $PWD/go.mod" >&2; exit 1; }
OUT=$TOOLS_DIR/k8s-$V
mkdir -p "$OUT"
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube-apiserver etcd)

ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=$(echo "$V" | cut -d. -f2) -X $p.gitTreeState=clean"
done
for c in "${components[@]}"; do
	case $c in
	kube-apiserver) pkg=k8s.io/kubernetes/cmd/kube-apiserver; cgo=0 ;;
	kubelet) pkg=k8s.io/kubernetes/cmd/kubelet; cgo=1 ;;
	etcd) pkg=go.etcd.io/etcd/server/v3; cgo=0 ;;
	*) echo "unknown component $c" >&2; exit 2 ;;
	esac
	if [ -x "$OUT/$c" ]; then
		continue
	fi
	echo "[build-k8s] building $c ($V) into $OUT"
	start=$(date +%s)
	CGO_ENABLED=$cgo go build -trimpath -ldflags "$ldflags" -o "$OUT/$c.new" "$pkg"
	mv "$OUT/$c.new" "$OUT/$c"
	echo "[build-k8s] $c built in $(( $(date +%s) - start ))s"
done
echo "$OUT"
