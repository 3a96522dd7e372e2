#!/usr/bin/env bash
# Build upstream's Gateway API conformance suite (the `go test -c` binary of
# sigs.k8s.io/gateway-api/conformance, which holds TestConformance), its
# echo-basic backend server and that server's container images, and cache
# the standard-channel CRDs the suite needs installed first. It owns only
# that build and its cache. See scripts/gateway-conformance.md for how the
# suite is run and what it expects from the cluster.
#
#   scripts/gateway-conformance.sh                  # the pinned version
#   GATEWAY_API_VERSION=v1.6.3 scripts/gateway-conformance.sh
#   scripts/gateway-conformance.sh --crds           # only standard-crds.yaml
#                                                   # (seconds; CI's kube-lab tests)
#
# Cached by version at /var/cache/podnet-peers/gateway-api-<version>/:
#   conformance.test       the suite (base/, tests/ and mesh/ manifests are
#                          embedded: it needs no source tree to run)
#   echo-basic             the backend every conformance test routes to (static)
#   standard-crds.yaml     config/crd/standard/gateway*.yaml of gateway-api@<version>,
#                          concatenated: `kubectl apply --server-side -f` it
#   images/*.tar           one OCI archive per image the suite's base and test
#                          manifests run: registry.k8s.io/gateway-api/echo-basic
#                          under each tag they name, and registry.k8s.io/coredns/
#                          coredns:<tag> (scripts/coredns.sh at that tag), for
#                          `ctr -n k8s.io images import`, so a kubelet with
#                          imagePullPolicy IfNotPresent runs them without a registry
#                          (images.list names them)
# with the same Go module and build caches as k8s-peers.sh. A warm machine
# only checks them (the binary lists TestConformance, the files are there).
# The last line printed is `GATEWAY_CONFORMANCE=/path/to/dir`, so a caller
# can `eval "$(scripts/gateway-conformance.sh | tail -1)"`; the lines before
# it are `archive=<path>`, one per image.
#
# The suite is its own module, sigs.k8s.io/gateway-api/conformance (tagged
# conformance/vX.Y.Z, published at the same version as the API module). Its
# go.mod requires sigs.k8s.io/gateway-api at v0.0.0 and replaces it with
# `../`, which Go ignores outside the main module. So the build goes through
# a small wrapper module that requires the suite and replaces the API module
# with its release at the same version. echo-basic is a main package of the
# suite's module (upstream's Dockerfile renames its hidden .go.mod).
#
# What differs from upstream's images: upstream's echo-basic is
# distroless/static:nonroot with /echo-basic as entrypoint; this one is the
# same static binary at /echo-basic, running as 65532:65532 (distroless's
# `nonroot`), with only the /etc/passwd, /etc/group and /tmp a static binary
# may look for (no CA certificates or tzdata: echo-basic reads neither).
# Upstream's CoreDNS runs as nonroot with cap_net_bind_service on the file;
# this one (same layout, /coredns) runs as root, see below. echo-basic is
# built with the suite module's dependency versions, not its .go.mod's.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$0")/.."

GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.6.3}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"
RECIPE_VERSION=1

say() { printf 'gateway-conformance: %s\n' "$*" >&2; }
die() { printf 'gateway-conformance: ERROR: %s\n' "$*" >&2; exit 1; }

V=$GATEWAY_API_VERSION
DIR="$CACHE/gateway-api-$V"
IMG="$DIR/images"
file_of() { echo "$IMG/$(echo "$1" | tr '/:' '__').tar"; }
key=$( { echo "recipe $RECIPE_VERSION $V"; sed -n '/^# recipe:/,$p' "$SELF"; cat scripts/lib/oci.sh; } | sha256sum | cut -c1-16)

works() {   # the suite lists TestConformance; the rest is there; same recipe
    local r
    [ "$(cat "$DIR/.key" 2>/dev/null)" = "$key" ] || return 1
    [ -x "$DIR/conformance.test" ] && [ -x "$DIR/echo-basic" ] && [ -s "$DIR/standard-crds.yaml" ] || return 1
    "$DIR/conformance.test" -test.list '^TestConformance$' 2>/dev/null | grep -qx TestConformance || return 1
    [ -s "$DIR/images.list" ] || return 1
    while read -r r; do [ -s "$(file_of "$r")" ] || return 1; done <"$DIR/images.list"
}
report() {
    local r
    while read -r r; do echo "archive=$(file_of "$r")"; done <"$DIR/images.list"
    echo "GATEWAY_CONFORMANCE=$DIR"
}

write_crds() {   # $1: gateway-api's source dir, $2: the file to write
    local f
    for f in "$1"/config/crd/standard/gateway*.yaml; do
        printf -- '---\n#\n# config/crd/standard/%s (sigs.k8s.io/gateway-api@%s)\n#\n' "${f##*/}" "$V"
        cat "$f"
        [ -z "$(tail -c1 "$f")" ] || echo
    done >"$2"
    grep -q "gateway.networking.k8s.io/bundle-version: $V" "$2" ||
        die "standard CRDs of $V carry no 'gateway.networking.k8s.io/bundle-version: $V' annotation (the suite checks it)"
}

if [ "${1:-}" = "--crds" ]; then
    if [ ! -s "$DIR/standard-crds.yaml" ]; then
        . scripts/lib/go.sh
        find_go
        go_env 0
        trap 'rm -f "$LOG"' EXIT
        run_go "module sigs.k8s.io/gateway-api@$V cannot be had" "${TMPDIR:-/tmp}" mod download -json "sigs.k8s.io/gateway-api@$V"
        src=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' "$LOG" | head -1)
        mkdir -p "$DIR"
        write_crds "$src" "$DIR/.standard-crds.yaml.$$"
        mv -f "$DIR/.standard-crds.yaml.$$" "$DIR/standard-crds.yaml"
    fi
    echo "GATEWAY_API_CRDS=$DIR/standard-crds.yaml"
    exit 0
fi

if works; then report; exit 0; fi

# recipe: everything below shapes the build (and so the cache key).
. scripts/lib/go.sh
find_go
go_env 0
trap 'rm -f "$LOG"' EXIT

gomod_dir() {   # module@version -> its source directory (after a download)
    run_go "module $1 cannot be had" "$CACHE" mod download -json "$1"
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' "$LOG" | head -1
}
mkdir -p "$CACHE"
say "fetching sigs.k8s.io/gateway-api{,/conformance}@$V ..."
api=$(gomod_dir "sigs.k8s.io/gateway-api@$V")
conf=$(gomod_dir "sigs.k8s.io/gateway-api/conformance@$V")
[ -f "$conf/go.mod" ] && [ -f "$conf/conformance_test.go" ] ||
    die "sigs.k8s.io/gateway-api/conformance@$V: no go.mod or conformance_test.go in '$conf'"
grep -q 'func TestConformance(' "$conf/conformance_test.go" ||
    die "sigs.k8s.io/gateway-api/conformance@$V: conformance_test.go has no TestConformance"
[ -f "$conf/echo-basic/echo-basic.go" ] || die "sigs.k8s.io/gateway-api/conformance@$V has no echo-basic/"
ls "$api"/config/crd/standard/gateway*.yaml >/dev/null 2>&1 || die "sigs.k8s.io/gateway-api@$V has no config/crd/standard/gateway*.yaml"

# The images the suite's base and test manifests run: echo-basic under every
# tag they name, and CoreDNS (base/manifests.yaml's `coredns` Deployment in
# gateway-conformance-infra, the UDPRoute tests' backend; the suite's setup
# waits for every pod of that namespace to be Ready, whatever the profile).
refs=$(grep -rhoE 'registry\.k8s\.io/(gateway-api/echo-basic|coredns/coredns):[A-Za-z0-9._-]+' "$conf"/base "$conf"/tests | sort -u)
echo "$refs" | grep -q '/echo-basic:' || die "no echo-basic image reference in $conf/{base,tests}"
# CoreDNS at the tag the manifests name, from scripts/coredns.sh (its own
# cache; it takes the peers' lock itself, so before this script does).
declare -A coredns_of=()
for coredns_v in $(echo "$refs" | sed -n 's|^registry\.k8s\.io/coredns/coredns:||p'); do
    coredns_of[$coredns_v]=$(COREDNS_VERSION="$coredns_v" scripts/coredns.sh | tail -1 | sed -n 's/^COREDNS=//p')
    [ -x "${coredns_of[$coredns_v]}" ] || die "scripts/coredns.sh gave no CoreDNS $coredns_v"
done

exec 9>"$CACHE/.lock"
flock 9
if works; then report; exit 0; fi   # built while we waited
mkdir -p "$DIR"
work=$(mktemp -d "$DIR/.build-XXXXXX")
trap 'rm -rf "$work" "$LOG"' EXIT

# The wrapper module: the suite, with the API module at its release.
wrap="$CACHE/go/wrap-gateway-api-$V"
mkdir -p "$wrap"
{
    echo "// Generated by scripts/gateway-conformance.sh: builds sigs.k8s.io/gateway-api/conformance@$V."
    echo "module podnet.local/gateway-conformance"
    echo
    grep -E '^go [0-9]|^godebug [a-z]' "$conf/go.mod"
    echo
    echo "require sigs.k8s.io/gateway-api/conformance $V"
    echo
    echo "replace sigs.k8s.io/gateway-api => sigs.k8s.io/gateway-api $V"
} >"$wrap/go.mod.new"
if ! cmp -s "$wrap/go.mod.new" "$wrap/go.mod"; then
    mv "$wrap/go.mod.new" "$wrap/go.mod"; rm -f "$wrap/go.sum"
else
    rm -f "$wrap/go.mod.new"
fi
[ -f "$wrap/main.go" ] || echo 'package main; func main() {}' >"$wrap/main.go"

say "building the conformance suite $V with $("$GO" version) (cold: a few minutes) ..."
t0=$(date +%s)
run_go "sigs.k8s.io/gateway-api/conformance@$V test binary (wrapper module $wrap)" "$wrap" \
    test -c -trimpath -ldflags="-s -w" -o "$work/conformance.test" sigs.k8s.io/gateway-api/conformance
say "built conformance.test in $(( $(date +%s) - t0 )) s"

say "building echo-basic $V ..."
t0=$(date +%s)
run_go "sigs.k8s.io/gateway-api/conformance/echo-basic@$V (wrapper module $wrap)" "$wrap" \
    build -trimpath -ldflags="-buildid= -s -w" -o "$work/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic
file "$work/echo-basic" 2>/dev/null | grep -q 'statically linked' ||
    die "echo-basic is not statically linked: $(file "$work/echo-basic" 2>&1)"
say "built echo-basic in $(( $(date +%s) - t0 )) s"

# The CRDs (and the ValidatingAdmissionPolicy that guards their upgrades), as
# upstream's hack/build-install-yaml.sh writes standard-install.yaml: each
# file after a `---` and a comment naming it.
write_crds "$api" "$work/standard-crds.yaml"

echo "$refs" >"$work/images.list"
case "$(uname -m)" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) ARCH=$(uname -m) ;; esac
. scripts/lib/oci.sh
mkdir -p "$IMG"
ENV='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'
while read -r ref; do
    r="$work/root"
    mkdir -p "$r/etc" "$r/tmp" "$r/home/nonroot"
    chmod 1777 "$r/tmp"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
    case "$ref" in
        */echo-basic:*)
            install -m 0755 "$work/echo-basic" "$r/echo-basic"
            oci "$ref" "$r" "{$ENV,\"Entrypoint\":[\"/echo-basic\"],\"WorkingDir\":\"/\",\"User\":\"65532:65532\",\"ExposedPorts\":{\"3000/tcp\":{},\"3001/tcp\":{},\"8443/tcp\":{}}}" ;;
        */coredns:*)
            # Upstream's runs as nonroot with cap_net_bind_service set on the
            # file; an archive written by tar_fixed keeps no file capabilities,
            # so this one runs as root, and the pod's securityContext (drop
            # ALL, add NET_BIND_SERVICE) still lets it bind :53.
            install -m 0755 "${coredns_of[${ref##*:}]}" "$r/coredns"
            oci "$ref" "$r" "{$ENV,\"Entrypoint\":[\"/coredns\"],\"WorkingDir\":\"/\",\"User\":\"0:0\",\"ExposedPorts\":{\"53/tcp\":{},\"53/udp\":{}}}" ;;
    esac
done <"$work/images.list"

mv -f "$work/conformance.test" "$work/echo-basic" "$work/standard-crds.yaml" "$work/images.list" "$DIR/"
echo "$key" >"$DIR/.key"
works || die "built $DIR but it does not check out: $("$DIR/conformance.test" -test.list '.*' 2>&1 | head -5 || true)"
say "disk used by $DIR: $(du -sh "$DIR" 2>/dev/null | cut -f1)"
report
