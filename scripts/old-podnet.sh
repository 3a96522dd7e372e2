#!/usr/bin/env bash
# Builds the `podnet` binary of an earlier revision of this repository, for
# the upgrade and version-skew tests (podnet/tests/upgrade.rs).
#
#   scripts/old-podnet.sh                     # the last release: 943d8ce
#   scripts/old-podnet.sh <rev>               # any commit-ish in this repo's history
#   PODNET_OLD_REV=<rev> scripts/old-podnet.sh
#
# There are no release tags; the last commit that passed CI (943d8ce) stands
# for the last release. The source comes out of this repository's own git
# history (`git archive`, so the repository's worktrees are untouched), and
# is built with `cargo build -p podnet --locked` (a debug build, without
# debug info) in a target dir of its own. The binary is cached by commit
# under /var/cache/podnet-peers/podnet-<commit, 12 hex>/podnet (the cache
# root of scripts/k8s-peers.sh; PODNET_PEERS_CACHE overrides it); the
# source and target dirs are removed after a successful build
# (PODNET_OLD_KEEP_BUILD=1 keeps them). A warm cache only checks that the
# binary runs `--version`.
#
# The last line printed is `PODNET_OLD=/path/to/podnet`, so a caller can
# `eval "$(scripts/old-podnet.sh | tail -1)"`. Progress goes to stderr.
set -euo pipefail

REV="${1:-${PODNET_OLD_REV:-943d8ce}}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"

say() { printf 'old-podnet: %s\n' "$*" >&2; }
die() { printf 'old-podnet: ERROR: %s\n' "$*" >&2; exit 1; }

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel 2>/dev/null) ||
    die "$(dirname "$0")/.. is not a git checkout: the old version is built from its history"
commit=$(git -C "$repo" rev-parse --verify --quiet "$REV^{commit}") ||
    die "revision '$REV' is not in the history of $repo (a shallow clone? git fetch --unshallow)"
short=${commit:0:12}
dir="$CACHE/podnet-$short"
bin="$dir/podnet"

works() { [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; }
report() { echo "PODNET_OLD=$bin"; }

if works; then report; exit 0; fi

CARGO="${CARGO:-cargo}"   # cargo sets it for the tests that call this
command -v "$CARGO" >/dev/null || die "cargo (Rust toolchain) is required"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-podnet-$short"
flock 9
# Another run may have built it while we waited.
if works; then report; exit 0; fi

src="$CACHE/.podnet-src-$short"
target="$CACHE/.podnet-target-$short"
rm -rf "$src"
mkdir -p "$src" "$target"
say "extracting $commit ($(git -C "$repo" log -1 --format=%s "$commit" | cut -c1-60)) ..."
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$src"
say "building podnet at $short (cold: several minutes) ..."
t0=$(date +%s)
# No debug info: the binary is run, not debugged, and the build is smaller.
if ! (cd "$src" && CARGO_TARGET_DIR="$target" CARGO_PROFILE_DEV_DEBUG=0 \
        "$CARGO" build --locked -p podnet --bin podnet) >&2; then
    die "cargo build of $short failed (source kept in $src)"
fi
mkdir -p "$dir"
cp -f "$target/debug/podnet" "$dir/.podnet.tmp"
mv -f "$dir/.podnet.tmp" "$bin"
say "built in $(( $(date +%s) - t0 )) s"
works || die "$bin was built but does not run: $("$bin" --version 2>&1 | head -5 || true)"
if [ "${PODNET_OLD_KEEP_BUILD:-}" != 1 ]; then
    rm -rf "$src" "$target"
fi
say "disk used by $dir: $(du -sh "$dir" 2>/dev/null | cut -f1)"
report
