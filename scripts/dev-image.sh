#!/usr/bin/env bash
# A podnet image from a podnet binary already built, for tests: the binary at
# /podnet with the shared libraries `ldd` names, as an OCI archive for
# `ctr images import`, under the name deploy/ uses (localhost/podnet:<version>).
# scripts/image.sh builds the release image (static, musl, with podman); this
# one takes seconds, so the real-kubelet test (podnet/tests/kubelet_lab.rs)
# runs the binary under test from deploy/podnet.yaml unchanged.
#
#   scripts/dev-image.sh target/release/podnet /tmp/podnet.tar
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: scripts/dev-image.sh BIN OUT.tar}
OUT=${2:?usage: scripts/dev-image.sh BIN OUT.tar}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
REF=${PODNET_IMAGE:-localhost/podnet:$VERSION}
say() { printf 'dev-image: %s\n' "$*" >&2; }
case "$(uname -m)" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) ARCH=$(uname -m) ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
file_of() { echo "$OUT"; }
. scripts/lib/oci.sh
mkdir -p "$work/root/tmp"
add_bin "$work/root" "$BIN" /podnet
oci "$REF" "$work/root" '{"Entrypoint":["/podnet"],"WorkingDir":"/"}'
echo "image=$REF"
