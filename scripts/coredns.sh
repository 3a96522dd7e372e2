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
GO="${GO:-}"

say() { printf 'coredns: %s\n' "$*" >&2; }
die() { printf 'coredns: ERROR: %s\n' "$*" >&2; exit 1; }

BIN="$CACHE/coredns-$COREDNS_VERSION/coredns"
works() {   # the cached binary runs and says its version (read whole: grep -q would SIGPIPE it)
    local v
    [ -x "$BIN" ] && v=$("$BIN" -version 2>/dev/null) && [[ "$v" == *"CoreDNS-${COREDNS_VERSION#v}"* ]]
}

if works; then echo "COREDNS=$BIN"; exit 0; fi

if [ -z "$GO" ]; then
    if command -v go >/dev/null 2>&1; then GO=$(command -v go)
    elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
    else die "no Go toolchain found (set GO=/path/to/go)"; fi
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if works; then echo "COREDNS=$BIN"; exit 0; fi   # built while we waited

export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/pkg/mod"
export GOCACHE="$CACHE/go/build-cache"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
unset GOWORK GO111MODULE GOOS GOARCH 2>/dev/null || true
mkdir -p "$GOMODCACHE" "$GOCACHE"

TMPBIN=$(mktemp -d "$CACHE/.coredns-$COREDNS_VERSION.XXXXXX")
LOG=$(mktemp "${TMPDIR:-/tmp}/coredns-build.XXXXXX")
trap 'rm -rf "$TMPBIN" "$LOG"' EXIT

say "building github.com/coredns/coredns@$COREDNS_VERSION with $("$GO" version) (cold: minutes) ..."
t0=$(date +%s)
# coremain.GitCommit is what `coredns -version` prints after the Go version.
if ! (cd "$TMPBIN" && GOBIN="$TMPBIN" nice "$GO" install -trimpath \
        -ldflags="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
        "github.com/coredns/coredns@$COREDNS_VERSION") >"$LOG" 2>&1; then
    say "FAILED: go install github.com/coredns/coredns@$COREDNS_VERSION"
    say "go said:"
    grep -v '^go: downloading ' "$LOG" | sed 's/^/    /' >&2
    exit 1
fi
mkdir -p "$(dirname "$BIN")"
mv -f "$TMPBIN/coredns" "$BIN"
say "built in $(( $(date +%s) - t0 )) s"
works || die "built $BIN but '-version' does not say CoreDNS-${COREDNS_VERSION#v}: $("$BIN" -version 2>&1 | head -3 || true)"
"$BIN" -version | sed 's/^/coredns: /' >&2
say "disk used by $CACHE: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
echo "COREDNS=$BIN"
