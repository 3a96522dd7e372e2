#!/usr/bin/env bash
# Build real Kubernetes peers (kube-apiserver, kube-controller-manager, kubectl;
# optionally kube-proxy, etcd/etcdctl) from Go modules, for tests and benches.
#
#   scripts/k8s-peers.sh                 # kube-apiserver kube-controller-manager kubectl
#   scripts/k8s-peers.sh kubectl etcd    # only these
#   scripts/k8s-peers.sh kubelet kube-scheduler e2e.test agnhost
#                                        # a real-kubelet cluster and upstream's suites (scripts/e2e.sh)
#   scripts/k8s-peers.sh kube-proxy      # the peer of kubeproxy-bench and tests/kubeproxy_diff.rs
#                                        # (not in the default list, which `lab up --kube` needs;
#                                        # scripts/setup.sh builds it too)
#   K8S_VERSION=v1.34.4 scripts/k8s-peers.sh
#
# Binaries are cached by version under /var/cache/podnet-peers/<component>-<version>/.
# A warm machine only checks that each binary exists and runs `--version`.
# The last lines printed are `NAME=/path/to/binary`, one per component, so a
# caller can `eval "$(scripts/k8s-peers.sh | grep '^[A-Z_]*=')"`.
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, ...) at v0.0.0 and
# points them at ./staging with replace directives, which Go ignores outside the
# main module. So the build goes through a small wrapper module whose go.mod
# replaces every staging module with its published release (v1.X.Y <-> v0.X.Y).
# The staging list is read from the kubernetes go.mod itself.
set -euo pipefail

# k8s-openapi 0.29's newest feature is v1_37; v1.37.2 is the newest patch on the proxy.
# Known good too: v1.34.4 (v1.34.5's staging modules are missing from the checksum database).
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"
GO="${GO:-}"

say() { printf 'k8s-peers: %s\n' "$*" >&2; }
die() { printf 'k8s-peers: ERROR: %s\n' "$*" >&2; exit 1; }

if [ -z "$GO" ]; then
    if command -v go >/dev/null 2>&1; then GO=$(command -v go)
    elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
    else die "no Go toolchain found (set GO=/path/to/go)"; fi
fi

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube-apiserver kube-controller-manager kubectl)

version_of() {   # component -> version it is built at
    case "$1" in
        kube-apiserver|kube-controller-manager|kubectl|kube-proxy|kubelet|kube-scheduler|e2e.test|agnhost)
            echo "$K8S_VERSION" ;;
        etcd|etcdctl) echo "$ETCD_VERSION" ;;
        *) die "unknown component '$1' (known: kube-apiserver kube-controller-manager kubectl kube-proxy kubelet kube-scheduler e2e.test agnhost etcd etcdctl)" ;;
    esac
}
bin_of() { echo "$CACHE/$1-$(version_of "$1")/$1"; }
works() {        # component -> 0 if its cached binary runs
    local b; b=$(bin_of "$1")
    [ -x "$b" ] || return 1
    case "$1" in
        kubectl) "$b" version --client >/dev/null 2>&1 ;;
        etcdctl) "$b" version >/dev/null 2>&1 ;;
        agnhost) "$b" --help >/dev/null 2>&1 ;;
        e2e.test) "$b" --help 2>&1 | grep -q -- '-ginkgo.focus' ;;
        *) "$b" --version >/dev/null 2>&1 ;;
    esac
}
report() {
    local c var
    for c in "${components[@]}"; do
        var=$(echo "$c" | tr 'a-z.-' 'A-Z__')
        echo "$var=$(bin_of "$c")"
    done
}

# Fast path: everything cached and runnable.
missing=()
for c in "${components[@]}"; do works "$c" || missing+=("$c"); done
if [ ${#missing[@]} -eq 0 ]; then report; exit 0; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
# Another run may have built them while we waited.
still=()
for c in "${missing[@]}"; do works "$c" || still+=("$c"); done
missing=("${still[@]+"${still[@]}"}")
if [ ${#missing[@]} -eq 0 ]; then report; exit 0; fi

export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/pkg/mod"
export GOCACHE="$CACHE/go/build-cache"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
unset GOWORK GO111MODULE GOOS GOARCH 2>/dev/null || true
mkdir -p "$GOMODCACHE" "$GOCACHE"

LOG=$(mktemp "${TMPDIR:-/tmp}/k8s-peers.XXXXXX")
trap 'rm -f "$LOG"' EXIT

# Run a go command in DIR; on failure name the module and print go's error.
run_go() {   # what dir go-args...
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
            say "      pick another version (e.g. K8S_VERSION=v1.34.4) or, trusting the proxy, set GONOSUMDB=k8s.io"
        fi
        exit 1
    fi
}

build_k8s() {   # components...
    local v=$K8S_VERSION staging_v gomod wrap dir c t0 ldflags
    staging_v="v0.${v#v1.}"
    wrap="$CACHE/go/wrap-kubernetes-$v"
    mkdir -p "$wrap"
    say "fetching k8s.io/kubernetes@$v ..."
    run_go "module k8s.io/kubernetes@$v cannot be had" "$wrap" \
        mod download -json "k8s.io/kubernetes@$v"
    gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' "$LOG" | head -1)
    [ -f "$gomod" ] || die "module k8s.io/kubernetes@$v: no go.mod in 'go mod download' output: $(cat "$LOG")"

    {
        echo "// Generated by scripts/k8s-peers.sh: builds k8s.io/kubernetes@$v commands."
        echo "module podnet.local/k8s-peers"
        echo
        grep -E '^go [0-9]|^godebug [a-z]' "$gomod"
        echo
        echo "require k8s.io/kubernetes $v"
        echo
        echo "replace ("
        awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod" |
            sort -u | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_v"; done
        echo ")"
    } >"$wrap/go.mod.new"
    grep -q '=>' "$wrap/go.mod.new" || die "k8s.io/kubernetes@$v: found no staging replaces in $gomod"
    if ! cmp -s "$wrap/go.mod.new" "$wrap/go.mod"; then
        mv "$wrap/go.mod.new" "$wrap/go.mod"; rm -f "$wrap/go.sum"
    else
        rm -f "$wrap/go.mod.new"
    fi
    [ -f "$wrap/main.go" ] || echo 'package main; func main() {}' >"$wrap/main.go"

    # Same stamps as hack/lib/version.sh, so --version and /version say the truth.
    local major minor date pkg
    major=$(echo "${v#v}" | cut -d. -f1); minor=$(echo "${v#v}" | cut -d. -f2)
    date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
    done

    for c in "$@"; do
        dir="$CACHE/$c-$v"
        say "building $c $v (cold: minutes) ..."
        t0=$(date +%s)
        case "$c" in
            e2e.test) run_go "k8s.io/kubernetes/test/e2e@$v (wrapper module $wrap)" "$wrap" \
                test -c -trimpath -ldflags="$ldflags" -o "$CACHE/.$c-$v.tmp" "k8s.io/kubernetes/test/e2e" ;;
            agnhost) run_go "k8s.io/kubernetes/test/images/agnhost@$v (wrapper module $wrap)" "$wrap" \
                build -trimpath -ldflags="$ldflags" -o "$CACHE/.$c-$v.tmp" "k8s.io/kubernetes/test/images/agnhost" ;;
            *) run_go "k8s.io/kubernetes/cmd/$c@$v (wrapper module $wrap)" "$wrap" \
                build -trimpath -ldflags="$ldflags" -o "$CACHE/.$c-$v.tmp" "k8s.io/kubernetes/cmd/$c" ;;
        esac
        mkdir -p "$dir"; mv -f "$CACHE/.$c-$v.tmp" "$dir/$c"
        say "built $c in $(( $(date +%s) - t0 )) s"
    done
}

build_etcd() {   # components...
    local v=$ETCD_VERSION wrap dir c t0 mod pkg
    wrap="$CACHE/go/wrap-etcd-$v"
    mkdir -p "$wrap"
    [ -f "$wrap/go.mod" ] || printf 'module podnet.local/etcd-peers\n\ngo 1.24\n' >"$wrap/go.mod"
    [ -f "$wrap/main.go" ] || echo 'package main; func main() {}' >"$wrap/main.go"
    for c in "$@"; do
        case "$c" in
            etcd) mod=go.etcd.io/etcd/server/v3; pkg=go.etcd.io/etcd/server/v3 ;;
            etcdctl) mod=go.etcd.io/etcd/etcdctl/v3; pkg=go.etcd.io/etcd/etcdctl/v3 ;;
        esac
        say "fetching $mod@$v ..."
        run_go "module $mod@$v cannot be had" "$wrap" get "$mod@$v"
        dir="$CACHE/$c-$v"
        say "building $c $v ..."
        t0=$(date +%s)
        run_go "$pkg@$v (wrapper module $wrap)" "$wrap" \
            build -trimpath -ldflags="-s -w" -o "$CACHE/.$c-$v.tmp" "$pkg"
        mkdir -p "$dir"; mv -f "$CACHE/.$c-$v.tmp" "$dir/$c"
        say "built $c in $(( $(date +%s) - t0 )) s"
    done
}

k8s=(); etcd=()
for c in "${missing[@]}"; do
    case "$c" in etcd|etcdctl) etcd+=("$c") ;; *) k8s+=("$c") ;; esac
done
[ ${#k8s[@]} -eq 0 ] || build_k8s "${k8s[@]}"
[ ${#etcd[@]} -eq 0 ] || build_etcd "${etcd[@]}"

for c in "${missing[@]}"; do
    works "$c" || die "$c was built at $(bin_of "$c") but does not run: $("$(bin_of "$c")" --version 2>&1 | head -5 || true)"
done
say "disk used by $CACHE: $(du -sh "$CACHE" 2>/dev/null | cut -f1)"
report
