#!/usr/bin/env bash
# The runtime stage of deploy/docker/Dockerfile installs a package for every
# shared library the binary needs directly (its ELF NEEDED entries), as found
# with dpkg on this Debian 12 machine. Libraries those need come in through
# apt dependencies. Needs a built binary: tests/deploy/run.sh build/walrelay.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
bin=${WALRELAY_DEPLOY_BINARY:-}
[[ -n $bin && -x $bin ]] || skip "no walrelay binary (pass it to run.sh or build build/walrelay)"
need readelf binutils
need dpkg-query dpkg

dockerfile=$REPO/deploy/docker/Dockerfile
# The runtime stage's apt-get install list.
runtime_pkgs=$(awk '/^FROM .* AS runtime/ {r=1} r && /apt-get install/ {i=1; print; next} i && /^ *&&/ {exit} i {print}' "$dockerfile" \
  | sed 's/[\\]$//' | tr -s ' \t' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vxE 'apt-get|install|rm|-y|&&' | sort -u)
[[ -n $runtime_pkgs ]] || fail "could not read the runtime package list from $dockerfile"
# Present in every debian:12-slim image (Essential or Priority: required).
base="libc6 libstdc++6 libgcc-s1 zlib1g libzstd1"

missing=()
while IFS= read -r lib; do
  path=$(ldd "$bin" | awk -v l="$lib" '$1 == l {print $3}')
  [[ -n $path ]] || fail "$lib is not resolved by ldd here"
  real=$(readlink -f "$path")
  pkg=$(dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$real" 2>/dev/null || true)
  pkg=${pkg%%:*}
  [[ -n $pkg ]] || fail "no Debian package owns $path"
  if grep -qxF "$pkg" <<<"$runtime_pkgs" || [[ " $base " == *" $pkg "* ]]; then
    ok "$lib from $pkg"
  else
    missing+=("$lib ($pkg)")
  fi
done < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
((${#missing[@]} == 0)) || fail "runtime stage lacks: ${missing[*]}"
