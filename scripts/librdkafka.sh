#!/usr/bin/env bash
# Builds librdkafka 2.8.0, Debian 13's, on this Debian 12 machine, into a
# prefix outside the repository, once per machine:
#
#   scripts/librdkafka.sh        prints the prefix (building it when absent)
#
# Debian 13's binary package needs glibc 2.38, but its source package builds
# here: its build dependencies for what walrelay uses (SSL, SASL, zstd, lz4,
# zlib) are Debian 12 packages. The source comes through apt with a deb-src
# entry for trixie in a private configuration (this machine's own apt sources
# stay as they are), checked against the signed index. Then
#   cmake -DWALRELAY_RDKAFKA_PREFIX="$(scripts/librdkafka.sh)" ...
# builds walrelay against it, with the prefix in the binaries' RPATH, and
# `walrelay --version` names the librdkafka it loaded.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/lib.sh"
version=2.8.0
prefix=${WALRELAY_RDKAFKA_PREFIX:-$CACHE_ROOT/librdkafka-$version}
if [[ -f $prefix/lib/pkgconfig/rdkafka.pc ]]; then
  echo "librdkafka: $version already built in $prefix" >&2
  echo "$prefix"
  exit 0
fi
packages=(dpkg-dev libssl-dev libsasl2-dev libzstd-dev liblz4-dev zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
apt_dir=$CACHE_ROOT/apt-trixie-src
work=$(mktemp -d "${TMPDIR:-/tmp}/librdkafka.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$apt_dir/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
  > "$apt_dir/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Get::List-Cleanup=0")
apt-get "${apt_opts[@]}" update -q >&2
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only -q "librdkafka=$version-1" >&2)
tar -C "$work" -xzf "$work/librdkafka_$version.orig.tar.gz"
src=$(find "$work" -maxdepth 1 -type d -name 'librdkafka-*' | head -n 1)
[[ -n $src ]] || { echo "librdkafka: no source tree in $work" >&2; exit 1; }
echo "librdkafka: building $version into $prefix" >&2
(
  cd "$src"
  ./configure --prefix="$prefix.tmp" --enable-ssl --enable-gssapi --enable-zstd --enable-lz4-ext --disable-curl \
    --disable-debug-symbols >"$work/configure.log" 2>&1 || { tail -n 30 "$work/configure.log" >&2; exit 1; }
  make -j"$(nproc)" libs >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; exit 1; }
  make install-subdirs >"$work/install.log" 2>&1 || { tail -n 30 "$work/install.log" >&2; exit 1; }
)
# The prefix is the final one in the .pc files; the build went to .tmp so
# that a failed build leaves no half-made prefix behind.
rm -rf "$prefix"
mv "$prefix.tmp" "$prefix"
sed -i "s#$prefix.tmp#$prefix#g" "$prefix"/lib/pkgconfig/*.pc
echo "librdkafka: $version built in $prefix" >&2
echo "$prefix"
