#!/usr/bin/env bash
# Builds the pause image the containerd (CRI) test gives containerd as its
# `sandbox_image`, offline: an OCI image layout in a tar archive, written by
# hand (no registry, no podman storage), for `ctr images import`.
#
# The image is one uncompressed layer holding busybox-static as
# /bin/busybox and /bin/sleep, with the entrypoint `sleep 2147483647`: a
# sandbox's process only has to stay up and hold the pod's namespaces
# (containerd stops it with SIGKILL).
#
# Idempotent and cached by content: the archive's name is a hash of busybox
# and of this recipe, under $PODNET_PAUSE_CACHE (default
# /var/cache/podnet-peers/pause). The archive itself is reproducible (fixed
# mtimes, owners and order), so the same inputs give the same digests.
#
# Prints two lines:
#   image=<reference>     the name `ctr images import` gives the image
#   archive=<path>
set -euo pipefail

BUSYBOX=${BUSYBOX:-/bin/busybox}
CACHE=${PODNET_PAUSE_CACHE:-/var/cache/podnet-peers/pause}
RECIPE_VERSION=1

[ -f "$BUSYBOX" ] || { echo "pause-image: $BUSYBOX missing: apt-get install -y --no-install-recommends busybox-static (or bash scripts/setup.sh)" >&2; exit 1; }
# The image has no loader: a dynamic busybox would not start (checked when
# file(1) is there; otherwise containerd's error says it).
if command -v file >/dev/null && file -L "$BUSYBOX" | grep -q 'dynamically linked'; then
  echo "pause-image: $BUSYBOX is dynamically linked; the image needs busybox-static" >&2
  exit 1
fi

case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH=$(uname -m) ;;
esac

key=$( { sha256sum "$BUSYBOX" | cut -d' ' -f1; echo "recipe $RECIPE_VERSION $ARCH"; sed -n '/^# recipe:/,$p' "$0"; } | sha256sum | cut -c1-16)
REF="localhost/podnet/pause:$key"
OUT="$CACHE/pause-$key.tar"

if [ -s "$OUT" ]; then
  echo "image=$REF"
  echo "archive=$OUT"
  exit 0
fi

# recipe: everything below shapes the archive (and so its cache key).
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT

tar_fixed() { # tar_fixed OUT DIR PATHS...: a reproducible ustar archive
  local out=$1 dir=$2
  shift 2
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=ustar \
    -C "$dir" -cf "$out" "$@"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

mkdir -p "$work/rootfs/bin" "$work/oci/blobs/sha256"
cp "$BUSYBOX" "$work/rootfs/bin/busybox"
chmod 0755 "$work/rootfs/bin" "$work/rootfs/bin/busybox"
ln -s busybox "$work/rootfs/bin/sleep"
tar_fixed "$work/layer.tar" "$work/rootfs" bin
layer=$(sha "$work/layer.tar")
mv "$work/layer.tar" "$work/oci/blobs/sha256/$layer"

printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/bin/sleep","2147483647"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$ARCH" "$layer" >"$work/config.json"
config=$(sha "$work/config.json")
config_size=$(size "$work/config.json")
mv "$work/config.json" "$work/oci/blobs/sha256/$config"

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$config" "$config_size" "$layer" "$(size "$work/oci/blobs/sha256/$layer")" >"$work/manifest.json"
manifest=$(sha "$work/manifest.json")
manifest_size=$(size "$work/manifest.json")
mv "$work/manifest.json" "$work/oci/blobs/sha256/$manifest"

# io.containerd.image.name is the name `ctr images import` gives the image.
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$ARCH" "$REF" "$key" >"$work/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"

tar_fixed "$work/image.tar" "$work/oci" oci-layout index.json blobs
mv "$work/image.tar" "$OUT"
echo "image=$REF"
echo "archive=$OUT"
