#!/usr/bin/env bash
# Builds deploy/docker/Dockerfile for real and mounts the image's root file
# system, for the deploy tests to run the image's own binary and entry point.
#
#   tests/deploy/image.sh build     builds walrelay:test; prints the root it mounted
#   tests/deploy/image.sh unmount   unmounts it and removes its working container
#
# There is no Docker engine here and no image registry. buildah builds the
# Dockerfile as it is, each RUN in a chroot (--isolation=chroot): podman's
# OCI runtime (crun) cannot start a container in this sandbox (no
# CAP_SYS_RESOURCE for its setrlimit, cgroups in hybrid mode). The base
# images the Dockerfile names, debian:<release> and debian:<release>-slim,
# are one debootstrap tree (minbase) imported under both names, once per
# machine: buildah's storage (/var/lib/containers) and the tree
# ($WALRELAY_IMAGE_CACHE, /var/cache/walrelay-image by default) live outside
# the repository, and --layers keeps the package layers between runs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${WALRELAY_IMAGE_CACHE:-/var/cache/walrelay-image}
dockerfile=$repo/deploy/docker/Dockerfile
release=$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$dockerfile")
[[ -n $release ]] || { echo "image.sh: no ARG DEBIAN_RELEASE in $dockerfile" >&2; exit 1; }
# No setrlimit calls in RUN (see above).
conf=$cache/containers.conf
buildah_() { CONTAINERS_CONF=$conf buildah "$@"; }

base_images() {
  mkdir -p "$cache"
  printf '[containers]\ndefault_ulimits = []\n' > "$conf"
  if buildah_ images -q "localhost/debian:$release" >/dev/null 2>&1 &&
     buildah_ images -q "localhost/debian:$release-slim" >/dev/null 2>&1; then
    echo "image.sh: base images debian:$release and -slim already here" >&2
    return
  fi
  local tree=$cache/$release
  if [[ ! -x $tree/bin/sh ]]; then
    echo "image.sh: debootstrap $release (minbase) into $tree" >&2
    rm -rf "$tree.tmp"
    debootstrap --variant=minbase "$release" "$tree.tmp" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
      || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
    mv "$tree.tmp" "$tree"
  fi
  # Debian 12's buildah (1.28) has no `import`: an empty container from
  # scratch, the tree added as a tar archive (which `add` unpacks, special
  # files and owners included), committed under the base image's name.
  tar -C "$tree" -cf "$cache/$release.tar" .
  local ctr
  ctr=$(buildah_ from scratch)
  buildah_ add "$ctr" "$cache/$release.tar" / >/dev/null
  buildah_ config --cmd /bin/bash "$ctr"
  buildah_ commit --format docker "$ctr" "localhost/debian:$release" >/dev/null
  buildah_ rm "$ctr" >/dev/null
  rm -f "$cache/$release.tar"
  buildah_ tag "localhost/debian:$release" "localhost/debian:$release-slim"
}

case "${1:-}" in
  build)
    base_images
    echo "image.sh: buildah bud -f deploy/docker/Dockerfile (DEBIAN_RELEASE=$release)" >&2
    (cd "$repo" && buildah_ bud --pull=never --layers --format docker --isolation=chroot --network=host \
      -f deploy/docker/Dockerfile -t walrelay:test . >"$cache/build.log" 2>&1) \
      || { tail -n 40 "$cache/build.log" >&2; exit 1; }
    buildah_ rm walrelay-test-run >/dev/null 2>&1 || true
    buildah_ from --pull=never --name walrelay-test-run walrelay:test >/dev/null
    buildah_ mount walrelay-test-run ;;
  unmount)
    buildah_ umount walrelay-test-run >/dev/null 2>&1 || true
    buildah_ rm walrelay-test-run >/dev/null 2>&1 || true ;;
  *) echo "usage: $0 build|unmount" >&2; exit 2 ;;
esac
