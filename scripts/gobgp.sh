#!/usr/bin/env bash
# Build the real GoBGP (github.com/osrg/gobgp/v4: `gobgpd` and its CLI
# `gobgp`) from Go modules, the third BGP peer podnet's speaker is tested
# against (crates/bgp/tests/gobgp.rs), beside Debian's BIRD and FRR. It owns
# only that build and its cache.
#
#   scripts/gobgp.sh                          # the pinned version
#   GOBGP_VERSION=v4.7.0 scripts/gobgp.sh
#
# Cached by version at /var/cache/podnet-peers/gobgp-<version>/{gobgpd,gobgp},
# with the same Go module and build caches as k8s-peers.sh. A warm machine
# only runs `gobgpd --version`. The last line printed is
# `GOBGPD=/path/to/gobgpd` (the CLI beside it), so a caller can
# `eval "$(scripts/gobgp.sh | tail -1)"`.
set -euo pipefail

GOBGP_VERSION="${GOBGP_VERSION:-v4.8.0}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"

say() { printf 'gobgp: %s\n' "$*" >&2; }
die() { printf 'gobgp: ERROR: %s\n' "$*" >&2; exit 1; }

DIR="$CACHE/gobgp-$GOBGP_VERSION"
works() {   # both binaries run; gobgpd says its version
    local v
    [ -x "$DIR/gobgpd" ] && [ -x "$DIR/gobgp" ] && v=$("$DIR/gobgpd" --version 2>/dev/null) &&
        [[ "$v" == *"${GOBGP_VERSION#v}"* ]]
}

if works; then echo "GOBGPD=$DIR/gobgpd"; exit 0; fi

. "$(dirname "$0")/lib/go.sh"
find_go

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if works; then echo "GOBGPD=$DIR/gobgpd"; exit 0; fi   # built while we waited

go_env 0

TMPBIN=$(mktemp -d "$CACHE/.gobgp-$GOBGP_VERSION.XXXXXX")
trap 'rm -rf "$TMPBIN" "$LOG"' EXIT

say "building github.com/osrg/gobgp/v4@$GOBGP_VERSION with $("$GO" version) (cold: a few minutes) ..."
t0=$(date +%s)
for cmd in gobgpd gobgp; do
    GOBIN="$TMPBIN" run_go "go install .../cmd/$cmd@$GOBGP_VERSION" "$TMPBIN" install -trimpath \
        -ldflags="-s -w" "github.com/osrg/gobgp/v4/cmd/$cmd@$GOBGP_VERSION"
done
mkdir -p "$DIR"
mv -f "$TMPBIN/gobgpd" "$TMPBIN/gobgp" "$DIR/"
say "built in $(( $(date +%s) - t0 )) s"
works || die "built $DIR/gobgpd but '--version' does not say ${GOBGP_VERSION#v}: $("$DIR/gobgpd" --version 2>&1 | head -3 || true)"
echo "GOBGPD=$DIR/gobgpd"
