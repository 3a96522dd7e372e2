#!/usr/bin/env bash
# Upstream's Gateway API conformance suite (v1.6.3, profile GATEWAY-HTTP)
# against `podnet gateway`, on a fresh cluster of real kubelets (podnet lab
# up --kubelet) with podnet installed from deploy/podnet.yaml, as
# scripts/e2e.sh installs it. See scripts/gateway-conformance.md for what
# the suite takes and waits on.
#
#   scripts/gateway-conformance-run.sh
#   options: --nodes N (2)
#            --keep (leave the cluster up afterwards; `podnet lab --name NAME down`)
#            --podnet BIN (run this podnet binary, packed as the image by
#              scripts/dev-image.sh, instead of the release image of
#              scripts/image.sh and a release build)
#            --run-test NAME (one test only: the suite's -run-test)
#            --debug (the suite's -debug: every request and answer in the log)
#   env:     GWC_TIMEOUTS (the suite's -timeout-config-overrides;
#              default NamespacesMustBeReady:600, since 23 pods start on a
#              shared machine)
#            GWC_POOL (the Gateways' addresses; default
#              192.168.200.200-192.168.200.239, on the lab's underlay)
#            GWC_REPORT (where the report goes; default the repo's
#              conformance/gateway-api-<version>-report.yaml)
#            GWC_OUT (default /tmp/podnet-gateway-conformance/<time>/)
#            GWC_FEATURES (the suite's -supported-features; default the
#              features podnet claims)
#
# Steps: the suite and its images (scripts/gateway-conformance.sh, cached),
# the pause image (scripts/e2e-images.sh, cached), podnet; `lab up
# --kubelet` importing echo-basic, CoreDNS, pause and podnet into every
# node's containerd; the standard CRDs (server-side) BEFORE podnet, since
# the gateway serves Ingress only when it starts without them; node 1
# labelled podnet.io/gateway=true; deploy/podnet.yaml;
# GatewayClass `podnet` (controllerName podnet.io/gateway). The suite runs inside the
# lab's underlay namespace pn-<lab>-net (with an address of its own on the
# bridge), where both the Gateways' status address (the gateway node's
# underlay IP) and the apiserver (the lab gateway's forwarder, which the
# kubelets use too) are reachable.
#
# Outputs: the report at conformance/gateway-api-v1.6.3-report.yaml, the
# suite's log (and this script's lines) at /tmp/gateway-conformance.log;
# the gateway's and the lab's logs in $GWC_OUT before the cluster goes.
# The last line is `N passed, N failed, N skipped`, counting the suite's
# tests (the direct subtests TestConformance/<Test> of `go test -v`'s
# output); the exit status is 1 when any failed.
set -euo pipefail
# All in one function, parsed before it runs (as scripts/e2e.sh).
main() {
    cd "$(dirname "$0")/.."
    usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
    GWC_POOL=${GWC_POOL:-192.168.200.200-192.168.200.239}
    NODES=2; KEEP=0; BIN=""; RUN_TEST=""; DEBUG=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) NODES=$2; shift 2 ;;
            --keep) KEEP=1; shift ;;
            --podnet) BIN=$(realpath "$2"); shift 2 ;;
            --run-test) RUN_TEST=$2; shift 2 ;;
            --debug) DEBUG=1; shift ;;
            *) usage ;;
        esac
    done
    V=v1.6.3
    LOG=/tmp/gateway-conformance.log
    REPORT=${GWC_REPORT:-$PWD/conformance/gateway-api-$V-report.yaml}
    # The features podnet claims (its GatewayClass's supportedFeatures).
    FEATURES=Gateway,GatewayHTTPListenerIsolation,GatewayPort8080,HTTPRoute,HTTPRoute303RedirectStatusCode,HTTPRoute307RedirectStatusCode,HTTPRoute308RedirectStatusCode,HTTPRouteBackendProtocolH2C,HTTPRouteBackendProtocolWebSocket,HTTPRouteBackendRequestHeaderModification,HTTPRouteBackendTimeout,HTTPRouteHostRewrite,HTTPRouteMethodMatching,HTTPRouteNamedRouteRule,HTTPRouteParentRefPort,HTTPRoutePathRedirect,HTTPRoutePathRewrite,HTTPRoutePortRedirect,HTTPRouteQueryParamMatching,HTTPRouteRequestMirror,HTTPRouteRequestMultipleMirrors,HTTPRouteRequestPercentageMirror,HTTPRouteRequestTimeout,HTTPRouteResponseHeaderModification,HTTPRouteSchemeRedirect,ReferenceGrant
    OUT=${GWC_OUT:-/tmp/podnet-gateway-conformance/$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$OUT" "$(dirname "$REPORT")"
    : >"$LOG"
    T0=$(date +%s)
    say() { printf 'gateway-conformance-run: %s\n' "$*" | tee -a "$LOG" >&2; }

    say "peers (cached by version; a cold machine builds them) ..."
    eval "$(bash scripts/k8s-peers.sh kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler | grep '^[A-Z0-9_]*=')"
    bash scripts/node-peers.sh >/dev/null
    GWC=$(bash scripts/gateway-conformance.sh)
    mapfile -t ARCHIVES < <(echo "$GWC" | sed -n 's/^archive=//p')
    GATEWAY_CONFORMANCE=$(echo "$GWC" | sed -n 's/^GATEWAY_CONFORMANCE=//p' | tail -1)
    [ -x "$GATEWAY_CONFORMANCE/conformance.test" ] || { say "ERROR: no conformance.test from scripts/gateway-conformance.sh"; exit 1; }
    # The kubelet's sandbox image (registry.k8s.io/pause:3.10.2); the other
    # e2e images are not needed.
    PAUSE=$(bash scripts/e2e-images.sh | sed -n 's/^archive=\(.*registry.k8s.io_pause_.*\)/\1/p')
    [ -s "$PAUSE" ] || { say "ERROR: scripts/e2e-images.sh named no pause archive"; exit 1; }
    PODNET_TAR="$OUT/podnet-image.tar"
    if [ -n "$BIN" ]; then
        # A copy: a build meanwhile cannot change the binary under the lab.
        cp "$BIN" "$OUT/podnet"
        PODNET=$OUT/podnet
        bash scripts/dev-image.sh "$PODNET" "$PODNET_TAR" >/dev/null
    else
        nice -n 19 bash scripts/image.sh --save "$PODNET_TAR" >/dev/null
        nice -n 19 cargo build --release --locked -p podnet >&2
        PODNET=$PWD/target/release/podnet
    fi
    VERSION=$(git describe --tags --always --dirty 2>/dev/null || git rev-parse --short HEAD)

    COUNTS=""
    LAB="gwc$(( $$ % 100000 ))"
    NET="pn-$LAB-net"
    imgs=()
    for a in "${ARCHIVES[@]}" "$PAUSE" "$PODNET_TAR"; do imgs+=(--image "$a"); done
    finish() {
        local rc=$?
        trap - EXIT INT TERM
        if [ -n "${KUBECONFIG:-}" ] && [ -f "$KUBECONFIG" ]; then
            "$KUBECTL" -n kube-system logs ds/podnet-gateway --tail=-1 >"$OUT/podnet-gateway.log" 2>&1 || true
            "$KUBECTL" get pods -A -o wide >"$OUT/pods.txt" 2>&1 || true
            "$KUBECTL" get gatewayclass,gateway,httproute -A -o yaml >"$OUT/gateway-objects.yaml" 2>&1 || true
        fi
        if [ -d "/run/podnet-lab/$LAB/logs" ]; then
            mkdir -p "$OUT/logs"; cp -r "/run/podnet-lab/$LAB/logs/." "$OUT/logs/" 2>/dev/null || true
        fi
        if [ "$KEEP" = 1 ]; then
            say "cluster kept: KUBECONFIG=/run/podnet-lab/$LAB/kubeconfig; $PODNET lab --name $LAB down"
        else
            "$PODNET" lab --name "$LAB" down >/dev/null 2>&1 || true
            say "cluster $LAB down"
        fi
        rm -f "$PODNET_TAR"
        say "took $(( $(date +%s) - T0 )) s; logs in $OUT"
        [ -z "$COUNTS" ] || echo "$COUNTS"
        exit $rc
    }
    trap finish EXIT INT TERM

    say "cluster $LAB: $NODES real nodes (images: ${#ARCHIVES[@]} of the suite's, pause, podnet) ..."
    up=$("$PODNET" lab --name "$LAB" up --nodes "$NODES" --kubelet "${imgs[@]}")
    echo "$up" >&2
    export KUBECONFIG=/run/podnet-lab/$LAB/kubeconfig
    host=$(echo "$up" | sed -n 's/.*kubernetesServiceHost: \([0-9.]*\).*/\1/p')
    port=$(echo "$up" | sed -n 's/.*kubernetesServicePort: \([0-9]*\).*/\1/p')
    api=${host:+$host:$port}
    [ -n "$api" ] || { say "ERROR: lab up named no API address"; exit 1; }

    # The admin kubeconfig names 127.0.0.1 (this namespace); the underlay
    # reaches the apiserver at the lab gateway's forwarder, as kubelets do.
    KC_NET="$OUT/kubeconfig-underlay"
    sed "s|server: https://127.0.0.1:[0-9]*|server: https://$api|" "$KUBECONFIG" >"$KC_NET"
    grep -q "server: https://$api" "$KC_NET" || { say "ERROR: no server line to rewrite in $KUBECONFIG"; exit 1; }
    # A client outside the cluster: an address on the underlay bridge.
    ip netns exec "$NET" ip addr add 192.168.200.250/24 dev br0
    ip netns exec "$NET" env KUBECONFIG="$KC_NET" "$KUBECTL" get --raw /readyz >/dev/null ||
        { say "ERROR: the apiserver ($api) is not reachable from $NET"; exit 1; }

    say "Gateway API $V standard CRDs (server-side), before podnet's gateway starts ..."
    "$KUBECTL" apply --server-side -f "$GATEWAY_CONFORMANCE/standard-crds.yaml" >&2
    "$KUBECTL" get crd -o name | grep 'gateway.networking.k8s.io$' |
        xargs "$KUBECTL" wait --for=condition=Established --timeout=60s >&2

    GW_NODE=$("$KUBECTL" get nodes -o jsonpath='{.items[0].metadata.name}')
    "$KUBECTL" label node "$GW_NODE" podnet.io/gateway=true --overwrite >&2
    say "kubectl apply -f deploy/podnet.yaml (API at $api, gateway on $GW_NODE) ..."
    # Each Gateway an address of its own (the suite's Gateways share port
    # 80), from the underlay's top addresses, which no node uses; the
    # gateway then needs NET_ADMIN to put them on its node's loopback.
    sed -e "s|^  # gatewayAddressPool: .*|  gatewayAddressPool: \"$GWC_POOL\"|" \
        -e "/With gatewayAddressPool set/,/add:/ s|add: \[NET_BIND_SERVICE\]|add: [NET_BIND_SERVICE, NET_ADMIN]|" \
        -e "s|^  # kubernetesServiceHost: .*|  kubernetesServiceHost: \"${api%:*}\"|" \
        -e "s|^  # kubernetesServicePort: .*|  kubernetesServicePort: \"${api#*:}\"|" \
        deploy/podnet.yaml >"$OUT/podnet.yaml"
    grep -q "kubernetesServiceHost: \"${api%:*}\"" "$OUT/podnet.yaml" ||
        { say "ERROR: deploy/podnet.yaml has no kubernetesServiceHost line to set"; exit 1; }
    grep -q "gatewayAddressPool: \"$GWC_POOL\"" "$OUT/podnet.yaml" && [ "$(grep -c 'NET_BIND_SERVICE, NET_ADMIN\]' "$OUT/podnet.yaml")" = 1 ] ||
        { say "ERROR: could not set gatewayAddressPool and NET_ADMIN in deploy/podnet.yaml"; exit 1; }
    grep -q 'name: podnet-gateway' "$OUT/podnet.yaml" ||
        { say "ERROR: deploy/podnet.yaml has no podnet-gateway DaemonSet"; exit 1; }
    "$KUBECTL" apply -f "$OUT/podnet.yaml" >&2
    "$KUBECTL" -n kube-system rollout status ds/podnet-agent --timeout=300s >&2
    "$KUBECTL" -n kube-system rollout status deploy/podnet-dns --timeout=300s >&2
    "$KUBECTL" -n kube-system rollout status ds/podnet-gateway --timeout=300s >&2
    "$KUBECTL" wait --for=condition=Ready node --all --timeout=300s >&2
    "$KUBECTL" get pods -n kube-system -o wide | tee "$OUT/kube-system-pods.txt" >&2

    say "GatewayClass podnet (controllerName podnet.io/gateway) ..."
    "$KUBECTL" apply -f - >&2 <<'YAML'
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: podnet}
spec: {controllerName: podnet.io/gateway}
YAML
    "$KUBECTL" wait --for=condition=Accepted gatewayclass/podnet --timeout=120s >&2 ||
        { say "ERROR: GatewayClass podnet not Accepted"; "$KUBECTL" get gatewayclass podnet -o yaml >&2; exit 1; }

    args=(-test.run '^TestConformance$' -test.v -test.timeout 0
          -kubeconfig "$KC_NET" -gateway-class podnet
          -conformance-profiles GATEWAY-HTTP -supported-features "${GWC_FEATURES:-$FEATURES}"
          -cleanup-base-resources=true
          -timeout-config-overrides "${GWC_TIMEOUTS:-NamespacesMustBeReady:600}"
          -report-output "$OUT/report.yaml"
          -organization podnet -project podnet -url https://github.com/podnet/podnet
          -version "$VERSION" -contact "podnet maintainers")
    [ -z "$RUN_TEST" ] || args+=(-run-test "$RUN_TEST")
    [ "$DEBUG" = 0 ] || args+=(-debug)
    say "conformance.test in $NET: ${args[*]}"
    say "(suite log: $LOG)"
    t1=$(date +%s)
    set +e
    ip netns exec "$NET" env KUBECONFIG="$KC_NET" \
        "$GATEWAY_CONFORMANCE/conformance.test" "${args[@]}" >>"$LOG" 2>&1
    rc=$?
    set -e
    say "conformance.test exited $rc after $(( $(date +%s) - t1 )) s"
    if [ -s "$OUT/report.yaml" ]; then
        cp "$OUT/report.yaml" "$REPORT"
        say "report: $REPORT"
    else
        say "WARNING: the suite wrote no report ($OUT/report.yaml)"
    fi
    grep -E '^\s*--- FAIL: TestConformance/[^/ ]+ ' "$LOG" | sed 's/^\s*/FAILED: /' >&2 || true
    count() { grep -cE "^\\s*--- $1: TestConformance/[^/ ]+ " "$LOG" || true; }
    pass=$(count PASS); fail=$(count FAIL); skip=$(count SKIP)
    if [ $((pass + fail + skip)) = 0 ]; then
        say "ERROR: no test results (exit $rc); the end of $LOG:"
        tail -30 "$LOG" >&2
        exit 1
    fi
    COUNTS="$pass passed, $fail failed, $skip skipped"
    echo "$COUNTS" >>"$LOG"
    [ "$fail" = 0 ] && [ "$rc" = 0 ]
}
# One line: bash has read it whole before main runs.
main "$@"; exit
