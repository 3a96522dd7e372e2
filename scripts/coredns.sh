#!/usr/bin/env bash
# Build the real CoreDNS (github.com/coredns/coredns) from Go modules, the peer
# `coredns-bench` measures podnet's cluster DNS against. It owns only that build
# and its cache; the Kubernetes peers are scripts/k8s-peers.sh's.
#
#   scripts/coredns.sh                        # the pinned version
#   COREDNS_VERSION=v1.14.7 scripts/coredns.sh
#
# Cached by version at /var/cache/podnet-peers/coredns-<version>/coredns, with the
# same Go module and build caches as k8s-peers.sh. A warm machine only runs
# `coredns -version`. The last line printed is `COREDNS=/path/to/coredns`, so a
# caller can `eval "$(scripts/coredns.sh | tail -1)"`.
#
# CoreDNS's go.mod has no replace directives, so `go install module@version`
# builds it as released, with its default plugin set (plugin.cfg), `kubernetes`
# included.
set -euo pipefail

# v1.15.0 is the newest release on the proxy (2026-11); its go.mod says go 1.26.0.
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"

say() { printf 'coredns: %s\n' "$*" >&2; }
die() { printf 'coredns: ERROR: %s\n' "$*" >&2; exit 1; }

BIN="$CACHE/coredns-$COREDNS_VERSION/coredns"
works() {   # the cached binary runs and says its version (read whole: grep -q would SIGPIPE it)
    local v
    [ -x "$BIN" ] && v=$("$BIN" -version 2>/dev/null) && [[ "$v" == *"CoreDNS-${COREDNS_VERSION#v}"* ]]
}

if works; then echo "COREDNS=$BIN"; exit 0; fi

. "$(dirname "$0")/lib/go.sh"
find_go

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if works; then echo "COREDNS=$BIN"; exit 0; fi   # built while we waited

go_env 0

TMPBIN=$(mktemp -d "$CACHE/.coredns-$COREDNS_VERSION.XXXXXX")
trap 'rm -rf "$TMPBIN" "$LOG"' EXIT

say "building github.com/coredns/coredns@$COREDNS_VERSION with $("$GO" version) (cold: minutes) ..."
t0=$(date +%s)
# coremain.GitCommit is what `coredns -version` prints after the Go version.
GOBIN="$TMPBIN" run_go "go install github.com/coredns/coredns@$COREDNS_VERSION" "$TMPBIN" install -trimpath \
    -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
    "github.com/coredns/coredns@$COREDNS_VERSION"
mkdir -p "$(dirname "$BIN")"
mv -f "$TMPBIN/coredns" "$BIN"
say "built in $(( $(date +%s) - t0 )) s"
works || die "built $BIN but '-version' does not say CoreDNS-${COREDNS_VERSION#v}: $("$BIN" -version 2>&1 | head -3 || true)"
"$BIN" -version | sed 's/^/coredns: /' >&2
say "disk used by $CACHE: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
echo "COREDNS=$BIN"
