#!/usr/bin/env bash
# `cmake --install` of the build directory, into a DESTDIR: the systemd unit
# it installs starts a binary that is there, the installed walrelay loads no
# library from the build machine's cache or a home directory (the unit runs
# it as a dynamic user with ProtectHome), and with the default prefix the
# installed unit is deploy/systemd/walrelay.service as shipped.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
need cmake cmake
need ldd libc-bin
bin=${WALRELAY_DEPLOY_BINARY:-}
[[ -n $bin && -x $bin ]] || skip "no walrelay binary (build it, or pass one to tests/deploy/run.sh)"
build=$(dirname "$bin")
[[ -f $build/CMakeCache.txt ]] || skip "$bin is not in a CMake build directory"
make_tmp
root=$tmp/root
DESTDIR=$root cmake --install "$build" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log" >&2; fail "cmake --install $build"; }
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
ok "cmake --install $build into DESTDIR (prefix $prefix)"

unit=$root$prefix/lib/systemd/system/walrelay.service
[[ -f $unit ]] || fail "no unit at $prefix/lib/systemd/system/walrelay.service: $(cat "$tmp/install.log")"
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[[ -x $root$exe ]] || fail "the installed unit's ExecStart=$exe is not installed: $(cat "$tmp/install.log")"
ok "the installed unit's ExecStart=$exe is installed"
doc=$(sed -n 's#^Documentation=file://##p' "$unit")
[[ -f $root$doc ]] || fail "the installed unit's Documentation=$doc is not installed"
ok "its Documentation=$doc is installed"
if [[ $prefix == /usr/local ]]; then
  diff -u "$REPO/deploy/systemd/walrelay.service" "$unit" || fail "the installed unit differs from deploy/systemd/walrelay.service"
  ok "with the default prefix, the installed unit is deploy/systemd/walrelay.service"
fi

libs=$(ldd "$root$exe")
if grep -F 'not found' <<<"$libs"; then fail "the installed walrelay misses libraries"; fi
rdkafka=$(awk '/librdkafka\.so/ { print $3 }' <<<"$libs")
[[ -z $rdkafka ]] || rdkafka=$(realpath "$rdkafka")
[[ -n $rdkafka ]] || fail "ldd names no librdkafka: $libs"
case $rdkafka in
  "$root$prefix"/lib/walrelay/*) ok "librdkafka from the install: ${rdkafka#"$root"}" ;;
  /usr/lib/*|/lib/*) ok "librdkafka from the system: $rdkafka" ;;
  *) fail "the installed walrelay loads librdkafka from $rdkafka, outside the install and the system" ;;
esac
home_libs=$(awk '$3 ~ "^(/root|/home)/" { print $3 }' <<<"$libs")
[[ -z $home_libs ]] || fail "the installed walrelay loads libraries from a home directory: $home_libs"
version=$("$root$exe" --version) || fail "$exe --version"
ok "installed: $version"
