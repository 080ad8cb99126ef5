#!/usr/bin/env bash
# update.sh VERSION [MODULE_DIR]: regenerate a build module's go.mod/go.sum
# (this one, or MODULE_DIR, e.g. ../k8s-old) for k8s.io/kubernetes VERSION
# (e.g. v1.37.2): its staging replace lines (./staging/src/k8s.io/X) become
# the published k8s.io/X v0.MINOR.PATCH.
set -euo pipefail
V=${1:?usage: update.sh vMAJOR.MINOR.PATCH [MODULE_DIR]}
cd "$(dirname "$0")"
cd "${2:-.}"
name=local/$(basename "$PWD")build
S=v0.${V#v1.}
mod=$(cd /tmp && go mod download -json "k8s.io/kubernetes@$V" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
{
	echo "module $name"
	echo
	sed -n 's/^go \(.*\)/go \1/p' "$mod"
	sed -n '/^godebug/p' "$mod"
	echo
	echo "require k8s.io/kubernetes $V"
	echo
	echo "replace ("
	sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/[a-z0-9-]*$#\t\1 => \1 '"$S"'#p' "$mod"
	echo ")"
} > go.mod
rm -f go.sum
GOFLAGS=-mod=mod go mod tidy
echo "go.mod for k8s.io/kubernetes $V with staging at $S"
