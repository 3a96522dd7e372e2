#!/usr/bin/env bash
# Build podnet's container image, offline, with podman: FROM scratch, one
# static (musl) `podnet` binary at /podnet, which is the agent, cluster DNS,
# the CNI plugins (node-setup installs them) and the CLI.
#
#   scripts/image.sh                       # -> localhost/podnet:<version>
#   PODNET_IMAGE=registry.example/podnet:v1 scripts/image.sh
#   scripts/image.sh --save FILE.tar       # also write a docker-archive
#
# What it needs is installed idempotently: the Rust musl target and
# musl-tools (for the C in sqlite and ring). The build itself reaches no
# network: crates come from the local cargo cache (cargo fetch ran for the
# tests) and the image has no base to pull.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'image: %s\n' "$*" >&2; }

TARGET=x86_64-unknown-linux-musl
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
TAG="${PODNET_IMAGE:-localhost/podnet:$VERSION}"
SAVE=""
if [ "${1:-}" = "--save" ]; then SAVE="${2:?--save needs a file}"; fi

rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"
command -v musl-gcc >/dev/null || {
    apt-get update -qq && apt-get install -y --no-install-recommends musl-tools
}
command -v podman >/dev/null || apt-get install -y --no-install-recommends podman runc

say "building podnet $VERSION for $TARGET (static)"
cargo build --release --locked -p podnet --target "$TARGET"
bin="target/$TARGET/release/podnet"
if ! file "$bin" | grep -q "static"; then
    file "$bin" >&2
    say "ERROR: $bin is not statically linked"
    exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/podnet"
strip "$ctx/podnet"
cat > "$ctx/Containerfile" <<'CF'
FROM scratch
COPY podnet /podnet
ENTRYPOINT ["/podnet"]
CF
# This machine's podman needs runc and cgroupfs (see shared notes).
cat > "$ctx/containers.conf" <<'CONF'
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
CONF
export CONTAINERS_CONF="$ctx/containers.conf"
podman build --quiet --network=none --pull=never \
    --label "org.opencontainers.image.version=$VERSION" \
    -t "$TAG" -f "$ctx/Containerfile" "$ctx" >/dev/null
# It runs: the binary answers from inside the image.
podman run --rm --network=none "$TAG" --version
size=$(podman image inspect "$TAG" --format '{{.Size}}')
say "$TAG: $((size / 1024 / 1024)) MiB ($size bytes)"
if [ -n "$SAVE" ]; then
    podman save --format docker-archive -o "$SAVE" "$TAG"
    say "saved $SAVE"
fi
echo "IMAGE=$TAG"
