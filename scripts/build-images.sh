#!/usr/bin/env bash
# Builds the Dockerfile's images with Buildah, without a container daemon or registry:
#   localhost/edit-runtime:TAG   (--target runtime)
#   localhost/edit-operator:TAG  (--target operator)
# and prints their sizes. What it needs, it installs (buildah, debootstrap: Debian
# packages). The base is a local Debian bookworm (localhost/debian:bookworm) made with
# `debootstrap --variant=minbase` when it is missing, so nothing is pulled from a registry.
# RUN steps use chroot isolation (OCI runtimes may be unable to run here); layers are
# cached, so a second run only rebuilds what changed.
#
#   scripts/build-images.sh [runtime] [operator]     (default: both)
#
# Environment: EDIT_IMAGE_TAG (default latest), EDIT_BASE_IMAGE (default
# localhost/debian:bookworm; any other must already exist or be pullable),
# EDIT_BUILD_JOBS (parallel compile jobs, default 2), EDIT_BUILD_NICE (default 10).
# With Docker instead: docker build --target runtime -t edit-runtime . (README).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tag=${EDIT_IMAGE_TAG:-latest}
base=${EDIT_BASE_IMAGE:-localhost/debian:bookworm}
jobs=${EDIT_BUILD_JOBS:-2}
niceness=${EDIT_BUILD_NICE:-10}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(runtime operator)
for t in "${targets[@]}"; do
  case "$t" in runtime|operator) ;; *) echo "build-images: unknown target $t (runtime, operator)" >&2; exit 2 ;; esac
done

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
die() { echo "build-images: $*" >&2; exit 1; }

missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-images: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_ apt-get update -qq
  sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "could not install ${missing[*]} (apt-get install ${missing[*]})"
fi
# buildah keeps images in root's storage; the chroot isolation needs root too.
[ "$(id -u)" -eq 0 ] || die "run as root (sudo scripts/build-images.sh): buildah's chroot isolation needs it"

# ---- the base image ------------------------------------------------------------------
make_base() {
  local rootfs ctr mnt mirror
  rootfs=$(mktemp -d /var/tmp/edit-debian-rootfs.XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$rootfs'" EXIT
  echo "build-images: $base is missing; debootstrap --variant=minbase bookworm (about a minute)"
  debootstrap --variant=minbase bookworm "$rootfs" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; die "debootstrap failed (log above; is Debian's mirror reachable?)"; }
  rm -f "$rootfs.log"
  # The suites of Debian's own bookworm image (updates and security too), on the mirror
  # debootstrap used.
  mirror=$(awk '$1 == "deb" {print $2; exit}' "$rootfs/etc/apt/sources.list")
  {
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$mirror"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [[ "$mirror" == */debian ]]; then
      printf '\nTypes: deb\nURIs: %s-security\nSuites: bookworm-security\nComponents: main\n' "$mirror"
      printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
  } >"$rootfs/etc/apt/sources.list.d/debian.sources"
  rm -f "$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  tar -C "$rootfs" -c . | tar -C "$mnt" -x --numeric-owner
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label org.opencontainers.image.description="debootstrap --variant=minbase bookworm" "$ctr"
  buildah commit --rm "$ctr" "$base" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  echo "build-images: made $base"
}

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  if [ "$base" = localhost/debian:bookworm ]; then
    make_base
  else
    echo "build-images: $base is not local; buildah will pull it"
  fi
fi

# ---- the images ----------------------------------------------------------------------
for t in "${targets[@]}"; do
  image=localhost/edit-$t:$tag
  echo "build-images: building $image (--target $t; the first build compiles for a long time)"
  start=$(date +%s)
  nice -n "$niceness" buildah bud --isolation chroot --layers \
    --build-arg BASE="$base" --build-arg EDIT_BUILD_JOBS="$jobs" \
    --target "$t" -t "$image" -f "$root/Dockerfile" "$root" \
    || die "buildah bud --target $t failed (output above)"
  echo "build-images: $image built in $(( $(date +%s) - start )) s"
done

echo
echo "image                                size"
for t in "${targets[@]}"; do
  image=localhost/edit-$t:$tag
  size=$(buildah images --format '{{.Size}}' "$image" | head -1)
  printf '%-36s %s\n' "$image" "$size"
done
