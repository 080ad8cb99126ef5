#!/usr/bin/env bash
# install-deps.sh: install, idempotently, everything the e2e tests and the demo need on a
# Debian (bookworm) machine as root: the distribution registry and containerd 1.6 (the legacy
# leg) from Debian; crictl/critest, kube-apiserver/etcd/kubelets, and containerd 2.3 (the default
# runtime, the reference) and 2.4 (the newest minor), each with runc, built from the Go module proxy;
# CRI-O 1.35 (RUNTIME=crio) with its CNI plugins from the module proxy, and conmon from Debian.
#
# Built tools go to $TOOLS_DIR (default /var/cache/cri-image-proxy/tools), outside the clone, so
# a later checkout on the same machine does not rebuild them.
#
# --demo installs only what `make demo` uses: the Debian packages of the rig and crictl (about 2
# minutes cold). The demo runs on containerd 2.3 once a full install has built it, on Debian's
# 1.6 until then.
#
# Env: TOOLS_DIR, CRI_TOOLS_VERSION (v1.34.0), CONTAINERD_VERSIONS ("v2.3.7 v2.4.2": the patches
# test/rig runs for CONTAINERD=2.3 and 2.4).
set -euo pipefail

demo=false
case "${1:-}" in
--demo) demo=true ;;
"") ;;
*) echo "usage: install-deps.sh [--demo]" >&2; exit 2 ;;
esac

TOOLS_DIR=${TOOLS_DIR:-/var/cache/cri-image-proxy/tools}
CRI_TOOLS_VERSION=${CRI_TOOLS_VERSION:-v1.34.0}
CONTAINERD_VERSIONS=${CONTAINERD_VERSIONS:-v2.3.7 v2.4.2}
export PATH=/usr/local/go/bin:$PATH
log() { echo "[install-deps] $*"; }

if [ "$(id -u)" != 0 ]; then
	echo "install-deps.sh must run as root (it installs Debian packages)" >&2
	exit 1
fi

# 1. Debian packages. The image ships a policy-rc.d that keeps packaged services from
#    starting, which is what we want: the tests run their own private instances.
# gcc and libc6-dev: the kubelet is built with cgo, as upstream builds it.
# systemd: systemd-analyze verify checks the unit (nothing is started).
# containerd and runc: Debian's 1.6 is the legacy leg (CONTAINERD=1.6); libseccomp-dev and
# pkg-config build the runc that goes with containerd 2.3 and 2.4 (build-containerd.sh), and CRI-O
# (seccomp, cgo); conmon (CRI-O's container monitor) is Debian's, and make builds CRI-O's pinns
# (build-crio.sh).
pkgs=(containerd runc docker-registry apache2-utils busybox-static iproute2 util-linux curl ca-certificates)
$demo || pkgs+=(gcc libc6-dev systemd libseccomp-dev pkg-config make conmon)
need=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "apt-get install ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}"
fi

# 2. crictl and critest. The module proxy serves cri-tools only at some versions, has no
#    @v/list (so `go install pkg@version` fails its deprecation check) and no sumdb entry:
#    download the module zip without sumdb and build inside a copy, with its own go.sum.
#    The demo needs crictl only; critest costs a few minutes more.
mkdir -p "$TOOLS_DIR"
want="crictl version $CRI_TOOLS_VERSION"
cmds=(crictl)
$demo || cmds+=(critest)
missing=()
for c in "${cmds[@]}"; do [ -x "$TOOLS_DIR/$c" ] || missing+=("$c"); done
[ "$("$TOOLS_DIR/crictl" --version 2>/dev/null)" = "$want" ] || missing=("${cmds[@]}")
if [ ${#missing[@]} -gt 0 ]; then
	log "building ${missing[*]} $CRI_TOOLS_VERSION (crictl about 2 minutes on a cold cache, critest 3-8 more)"
	dir=$(GOFLAGS=-mod=mod GONOSUMDB=sigs.k8s.io/cri-tools GONOSUMCHECK=1 \
		go mod download -json "sigs.k8s.io/cri-tools@$CRI_TOOLS_VERSION" |
		sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "could not download sigs.k8s.io/cri-tools@$CRI_TOOLS_VERSION" >&2; exit 1; }
	src=$(mktemp -d)
	trap 'rm -rf "$src"' EXIT
	cp -r "$dir/." "$src" && chmod -R u+w "$src"
	ldf="-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"
	for c in "${missing[@]}"; do
		case $c in
		crictl) (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldf" -o "$TOOLS_DIR/crictl.new" ./cmd/crictl) ;;
		critest) (cd "$src" && CGO_ENABLED=0 go test -c -trimpath -ldflags "$ldf" -o "$TOOLS_DIR/critest.new" ./cmd/critest) ;;
		esac
		mv "$TOOLS_DIR/$c.new" "$TOOLS_DIR/$c"
	done
fi
if $demo; then
	log "ready for the demo: $("$TOOLS_DIR/crictl" --version), $(containerd --version 2>/dev/null | head -1)"
	exit 0
fi
# 3. kube-apiserver, etcd and the kubelet for the service-account and node
#    tests (module hack/k8s; 5-11 minutes on a cold Go cache), and the old
#    kubelet (module hack/k8s-old, about 6 minutes more); all kept in
#    $TOOLS_DIR afterwards.
TOOLS_DIR=$TOOLS_DIR "$(dirname "$0")/build-k8s.sh" kube-apiserver etcd kubelet
TOOLS_DIR=$TOOLS_DIR "$(dirname "$0")/build-k8s.sh" --module k8s-old kubelet
# 4. containerd 2.3 and runc, the runtime the tests run on by default (about 20 minutes cold), then
#    2.4 (CONTAINERD=2.4; a few minutes more: most of its dependencies are 2.3's).
ready=()
for v in $CONTAINERD_VERSIONS; do
	out=$(TOOLS_DIR=$TOOLS_DIR CONTAINERD_VERSION=$v "$(dirname "$0")/build-containerd.sh" | tail -1)
	ready+=("$("$out/containerd" --version | awk '{print $1, $3}')")
done
# 5. CRI-O, the second runtime (RUNTIME=crio), its pinns, CNI plugins and runtime wrapper (a few
#    minutes cold; not part of `make test`).
out=$(TOOLS_DIR=$TOOLS_DIR "$(dirname "$0")/build-crio.sh" | tail -1)
ready+=("cri-o $("$out/crio" --version 2>/dev/null | awk 'NR == 1 {print $3}')")

log "ready: $(IFS=,; echo "${ready[*]}" | sed 's/,/, /g') (legacy: $(containerd --version 2>/dev/null | awk '{print $1, $3}')); $("$TOOLS_DIR/crictl" --version); tools in $TOOLS_DIR"
