# The Go side of the peer builders (scripts/k8s-peers.sh, node-peers.sh,
# coredns.sh): one toolchain lookup, one Go environment whose module and
# build caches live under the peers' cache root (so a second builder reuses
# what the first downloaded and compiled), and run_go, which names the
# module that failed and prints go's own error. The caller sets $CACHE and
# say()/die(). Go is only ever used to build real peers, never podnet.

# find_go: sets $GO (from $GO, PATH, or /usr/local/go).
find_go() {
    GO="${GO:-}"
    [ -n "$GO" ] && return
    if command -v go >/dev/null 2>&1; then GO=$(command -v go)
    elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
    else die "no Go toolchain found (set GO=/path/to/go)"; fi
}

# go_env CGO: the shared environment (CGO 0 or 1) and $LOG, a scratch file
# for go's output that the caller removes.
go_env() {
    export GOPATH="$CACHE/go"
    export GOMODCACHE="$CACHE/go/pkg/mod"
    export GOCACHE="$CACHE/go/build-cache"
    export GOTOOLCHAIN=local
    export GOFLAGS="-mod=mod -buildvcs=false"
    export CGO_ENABLED="$1"
    export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
    unset GOWORK GO111MODULE GOOS GOARCH 2>/dev/null || true
    mkdir -p "$GOMODCACHE" "$GOCACHE"
    LOG=$(mktemp "${TMPDIR:-/tmp}/go-peers.XXXXXX")
}

# run_go WHAT DIR GO-ARGS...: go in DIR; on failure says WHAT failed, the
# modules go's error names, go's error itself, and exits.
run_go() {
    local what=$1 dir=$2; shift 2
    if ! (cd "$dir" && "$GO" "$@") >"$LOG" 2>&1; then
        say "FAILED: $what"
        say "command: (cd $dir && go $*)"
        local mods
        mods=$(grep -oE '(^|[[:space:]:"])[a-z0-9-]+(\.[a-z0-9-]+)+(/[A-Za-z0-9._~+-]+)*@v[0-9][A-Za-z0-9.+-]*' "$LOG" |
            sed 's/^[[:space:]:"]//' | sort -u | head -20 || true)
        [ -z "$mods" ] || say "modules named in the error: $(echo $mods)"
        say "go said:"
        grep -v '^go: downloading ' "$LOG" | sed 's/^/    /' >&2
        if grep -q 'verifying module:.*sumdb.*404' "$LOG"; then
            say "hint: the checksum database behind this proxy lacks those module versions;"
            say "      pick another version or, trusting the proxy, set GONOSUMDB for their path"
        fi
        exit 1
    fi
}
