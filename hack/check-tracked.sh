#!/usr/bin/env bash
# Refuses tracked files that are build output or too big for a source tree, naming each:
#   - an ELF file (a compiled program or library), whatever its mode;
#   - a file with the executable bit that is not a script (it does not start with "#!");
#   - a file larger than MAX_BYTES (1 MiB unless set).
# Build output belongs in bin/ or _output/ (ignored); a large fixture is made by its test or
# fetched by make deps. Sizes are the staged blobs'; contents are read from the work tree.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
max=${MAX_BYTES:-1048576}

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	echo "check-tracked: not a git checkout, no tracked files to check"
	exit 0
fi

# "mode object path" per tracked file, then the object's size from one git cat-file.
mapfile -d '' entries < <(git ls-files --stage -z)
declare -A size=()
while read -r obj bytes; do
	size[$obj]=$bytes
done < <(for e in "${entries[@]}"; do o=${e#* }; echo "${o%% *}"; done |
	git cat-file --batch-check='%(objectname) %(objectsize)')

bad=0
refuse() {
	echo "tracked file $1: $2" >&2
	bad=1
}
for e in "${entries[@]}"; do
	mode=${e%% *}
	obj=${e#* }
	obj=${obj%% *}
	path=${e#*$'\t'}
	case $mode in
	120000 | 160000) continue ;; # a symlink, a submodule: no content of their own
	esac
	if ((size[$obj] > max)); then
		refuse "$path" "${size[$obj]} bytes, over the limit of $max"
	fi
	[[ -f $path ]] || continue # deleted in the work tree: only its size is known
	head=
	IFS= read -r -n 4 head <"$path" || true
	if [[ $head == $'\x7fELF' ]]; then
		refuse "$path" "an ELF binary (build output)"
	elif [[ $mode == 100755 && ${head:0:2} != '#!' ]]; then
		refuse "$path" "executable but not a script with a #! line"
	fi
done
exit $bad
