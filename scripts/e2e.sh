#!/usr/bin/env bash
# Upstream's own e2e suites against podnet, on a fresh cluster of real
# kubelets (podnet lab up --kubelet), with podnet installed as an operator
# installs it (kubectl apply -f deploy/podnet.yaml, the image imported into
# every node's containerd). No kube-proxy and no CoreDNS run: podnet is the
# cluster's network, Service proxy and DNS.
#
#   scripts/e2e.sh conformance            # [sig-network] ... [Conformance] (47 in v1.37.2)
#   scripts/e2e.sh netpol                 # [Feature:NetworkPolicy] (49; SCTP ones skipped)
#   scripts/e2e.sh network                # more of [sig-network] that fits a bare-metal lab
#   scripts/e2e.sh dualstack              # [Feature:IPv6DualStack] on a --dual-stack cluster
#   scripts/e2e.sh custom --focus REGEX   # anything
#   options: --focus REGEX  --skip REGEX (added to the suite's)  --nodes N (2)
#            --keep (leave the cluster up afterwards; `podnet lab --name NAME down`)
#            --podnet BIN (run this podnet binary, for the lab and packed as the
#              image by scripts/dev-image.sh, instead of building the release
#              image with scripts/image.sh and a release build: seconds instead
#              of minutes: for a quick custom run against a debug build)
#            --backend vxlan|host-gw|udp (the ConfigMap's Backend.Type; vxlan)
#            --dual-stack (a dual-stack cluster: IPv6 pod and Service CIDRs
#              beside the IPv4 ones, nodes with both addresses; the
#              `dualstack` suite implies it)
#
# The last line is `N passed, N failed, N skipped`. The JUnit file and the
# full log stay in $E2E_OUT (default /tmp/podnet-e2e/<suite>-<time>/); the
# nodes' and control plane's logs are copied there before the cluster goes.
#
# Skipped by rule (upstream's reasons, so nothing is skipped silently):
#   SCTP            this kernel has no SCTP sockets ([Feature:SCTPConnectivity],
#                   "using SCTP")
#   in `network` also:
#   [Disruptive]    they restart or break nodes and the control plane
#   LoadBalancer    needs a cloud provider's load balancers (issue 26 brings BGP)
#   [Feature:*]     opt-in features (NetworkPolicy has its own suite, `netpol`)
#   IPv6, DualStack run by the `dualstack` suite, on a dual-stack cluster
#   [Flaky]         upstream's own verdict
#   DNS configMap   they rewrite CoreDNS's (or kube-dns's) own ConfigMap to
#                   set stub domains and upstreams; podnet's DNS takes those
#                   as flags (--upstream), so the test's edit changes nothing
# Tests run one at a time ([Serial] ones too): e2e.test without ginkgo -p.
set -euo pipefail
# All in one function, parsed before it runs: editing this file while a
# suite runs cannot change what the running script does next.
main() {
    cd "$(dirname "$0")/.."

    usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
    [ $# -ge 1 ] || usage
    SUITE=$1; shift
    FOCUS=""; SKIP=""; NODES=2; KEEP=0; BIN=""; BACKEND=vxlan; DUAL=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --focus) FOCUS=$2; shift 2 ;;
            --skip) SKIP=$2; shift 2 ;;
            --nodes) NODES=$2; shift 2 ;;
            --keep) KEEP=1; shift ;;
            --podnet) BIN=$(realpath "$2"); shift 2 ;;
            --backend) BACKEND=$2; shift 2 ;;
            --dual-stack) DUAL=1; shift ;;
            *) usage ;;
        esac
    done

    SCTP='SCTPConnectivity|using SCTP'
    case "$SUITE" in
        conformance) F='\[sig-network\].*\[Conformance\]'; S="" ;;
        netpol) F='\[Feature:NetworkPolicy\]'; S="$SCTP" ;;
        network)
            F='\[sig-network\]'
            S="$SCTP|\\[Disruptive\\]|LoadBalancer|\\[Feature:|IPv6|DualStack|\\[Flaky\\]|DNS configMap" ;;
        dualstack) F='\[Feature:IPv6DualStack\]'; S="$SCTP|\\[Disruptive\\]|LoadBalancer"; DUAL=1 ;;
        custom) [ -n "$FOCUS" ] || { echo "e2e: custom needs --focus" >&2; exit 2; }; F=""; S="" ;;
        *) usage ;;
    esac
    [ -z "$FOCUS" ] || F="${F:+$F.*}$FOCUS"
    [ -z "$SKIP" ] || S="${S:+$S|}$SKIP"

    say() { printf 'e2e: %s\n' "$*" >&2; }
    OUT=${E2E_OUT:-/tmp/podnet-e2e/$SUITE-$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$OUT"

    say "peers (cached by version; a cold machine builds them) ..."
    eval "$(bash scripts/k8s-peers.sh kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler e2e.test agnhost | grep '^[A-Z0-9_]*=')"
    bash scripts/node-peers.sh >/dev/null
    mapfile -t ARCHIVES < <(bash scripts/e2e-images.sh | sed -n 's/^archive=//p')
    PODNET_TAR="$OUT/podnet-image.tar"
    if [ -n "$BIN" ]; then
        bash scripts/dev-image.sh "$BIN" "$PODNET_TAR" >/dev/null
        PODNET=$BIN
    else
        bash scripts/image.sh --save "$PODNET_TAR" >/dev/null
        cargo build --release --locked -p podnet >&2
        PODNET=$PWD/target/release/podnet
    fi

    LAB="e2e$(( $$ % 100000 ))"
    imgs=()
    for a in "${ARCHIVES[@]}" "$PODNET_TAR"; do imgs+=(--image "$a"); done
    finish() {
        local rc=$?
        if [ -d "/run/podnet-lab/$LAB/logs" ]; then
            mkdir -p "$OUT/logs"; cp -r "/run/podnet-lab/$LAB/logs/." "$OUT/logs/" 2>/dev/null || true
        fi
        if [ "$KEEP" = 1 ]; then
            say "cluster kept: KUBECONFIG=/run/podnet-lab/$LAB/kubeconfig; podnet lab --name $LAB down"
        else
            "$PODNET" lab --name "$LAB" down >/dev/null 2>&1 || true
        fi
        rm -f "$PODNET_TAR"
        exit $rc
    }
    trap finish EXIT INT TERM

    say "cluster $LAB: $NODES real nodes ..."
    dual=()
    [ "$DUAL" = 0 ] || dual=(--dual-stack)
    up=$("$PODNET" lab --name "$LAB" up --nodes "$NODES" --kubelet "${dual[@]}" "${imgs[@]}")
    echo "$up" >&2
    export KUBECONFIG=/run/podnet-lab/$LAB/kubeconfig
    host=$(echo "$up" | sed -n 's/.*kubernetesServiceHost: \([0-9.]*\).*/\1/p')
    port=$(echo "$up" | sed -n 's/.*kubernetesServicePort: \([0-9]*\).*/\1/p')
    api=${host:+$host:$port}
    [ -n "$api" ] || { say "ERROR: lab up named no API address"; exit 1; }

    say "kubectl apply -f deploy/podnet.yaml (API at $api, backend $BACKEND, no kube-proxy) ..."
    sed -e "s|^  # kubernetesServiceHost: .*|  kubernetesServiceHost: \"${api%:*}\"|" \
        -e "s|^  # kubernetesServicePort: .*|  kubernetesServicePort: \"${api#*:}\"|" \
        -e "s|\"Backend\": {\"Type\": \"vxlan\"}|\"Backend\": {\"Type\": \"$BACKEND\"}|" \
        deploy/podnet.yaml >"$OUT/podnet.yaml"
    if [ "$DUAL" = 1 ]; then
        # The lab's dual-stack ranges (kube-controller-manager's and the
        # apiserver's second CIDRs).
        sed -i -e 's|"ServiceCIDR": "10.96.0.0/12",|"ServiceCIDR": "10.96.0.0/12,fd00:10:96::/112", "EnableIPv6": true, "IPv6Network": "fd00:10:244::/56",|' "$OUT/podnet.yaml"
        grep -q '"EnableIPv6": true' "$OUT/podnet.yaml" ||
            { say "ERROR: deploy/podnet.yaml has no ServiceCIDR line to make dual-stack"; exit 1; }
    fi
    grep -q "\"Type\": \"$BACKEND\"" "$OUT/podnet.yaml" ||
        { say "ERROR: deploy/podnet.yaml has no Backend line to set to $BACKEND"; exit 1; }
    grep -q "kubernetesServiceHost: \"${api%:*}\"" "$OUT/podnet.yaml" ||
        { say "ERROR: deploy/podnet.yaml has no kubernetesServiceHost line to set"; exit 1; }
    "$KUBECTL" apply -f "$OUT/podnet.yaml" >&2
    "$KUBECTL" -n kube-system rollout status ds/podnet-agent --timeout=300s >&2
    "$KUBECTL" -n kube-system rollout status deploy/podnet-dns --timeout=300s >&2
    "$KUBECTL" wait --for=condition=Ready node --all --timeout=300s >&2
    "$KUBECTL" get pods -n kube-system -o wide | tee "$OUT/kube-system-pods.txt" >&2

    say "e2e.test: focus '$F' skip '$S' (log: $OUT/e2e.log)"
    args=(--kubeconfig="$KUBECONFIG" --provider=skeleton --report-dir="$OUT"
          --ginkgo.no-color --ginkgo.timeout=4h --ginkgo.focus="$F")
    [ -z "$S" ] || args+=(--ginkgo.skip="$S")
    set +e
    "$E2E_TEST" "${args[@]}" >"$OUT/e2e.log" 2>&1
    rc=$?
    set -e
    grep -E '^\[FAIL\]|^  \[FAIL\]' "$OUT/e2e.log" | sort -u >&2 || true
    junit=$(ls "$OUT"/junit*.xml 2>/dev/null | head -1 || true)
    [ -n "$junit" ] || { say "ERROR: no JUnit file (e2e.test exit $rc); see $OUT/e2e.log"; tail -20 "$OUT/e2e.log" >&2; exit 1; }
    say "JUnit: $junit"
    # Skipped: specs the suite's focus selects that its skip rules (named in
    # this script's header) left out, from a dry run of the focus alone.
    all=$("$E2E_TEST" --kubeconfig="$KUBECONFIG" --ginkgo.dry-run --ginkgo.no-color \
        ${F:+--ginkgo.focus="$F"} 2>/dev/null | sed -n 's/^Ran \([0-9]*\) of.*/\1/p' | tail -1)
    python3 - "$junit" "${all:-0}" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).getroot().iter("testcase")
         if c.get("name", "").startswith("[It]")]
p = f = ran = 0
for c in cases:
    if c.find("skipped") is not None:
        continue
    ran += 1
    if c.find("failure") is not None or c.find("error") is not None:
        f += 1
        print("FAILED:", c.get("name"), file=sys.stderr)
    else:
        p += 1
s = max(int(sys.argv[2]) - ran, 0)
print(f"{p} passed, {f} failed, {s} skipped")
PY
}
# One line: bash has read it whole before main runs, so an edit to this
# file meanwhile cannot add a command after it.
main "$@"; exit
