#!/usr/bin/env bash
# Installs everything podnet's build, tests, lab and benchmarks need.
# Idempotent: packages already present are not touched, apt is only
# consulted when something is missing. Run as root.
set -euo pipefail

PKGS=(
  iproute2 nftables iptables conntrack      # kernel tooling the tests inspect with
  containernetworking-plugins                # reference CNI plugins (differential tests, bench)
  podman runc busybox-static                 # a real CNI runtime, and a rootfs for its containers
  containerd                                 # a real CRI runtime (podnet/tests/cri.rs; pause image: scripts/pause-image.sh)
  protobuf-compiler libprotobuf-dev etcd-server  # etcd-client build (protoc + well-known protos), etcd tests
  dnsutils iperf3 iputils-ping               # DNS and data-plane checks (ping -M do), benchmarks
  dnsperf unbound                            # dns-bench: load generator and the resolver we compare with
  chromium                                   # a real headless browser for the web view's test (podnet/tests/ui.rs)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }

# Real Kubernetes peers for the Kubernetes-mode tests (kube lab, differential
# tests): kube-apiserver, kube-controller-manager and kubectl, plus kube-proxy
# (podnet/tests/kubeproxy_diff.rs diffs podnet's proxy against it; the same
# k8s.io/kubernetes module, so little more to build), built from Go modules
# and cached by version under /var/cache/podnet-peers. Cold: about 10 minutes
# on 2 cores; warm: a fraction of a second. Tests find them through the same
# script (PODNET_K8S_PEERS=skip leaves them out).
if [ "${PODNET_K8S_PEERS:-}" != skip ]; then
  bash "$(dirname "$0")/k8s-peers.sh" kube-apiserver kube-controller-manager kubectl kube-proxy >/dev/null
fi

# The real CoreDNS, the peer of the cluster-DNS differential test
# (podnet/tests/coredns_diff.rs) and of coredns-bench: built from Go modules
# and cached by version under /var/cache/podnet-peers (cold: about 8 minutes
# on 2 cores; warm: a fraction of a second). PODNET_COREDNS=skip leaves it out.
if [ "${PODNET_COREDNS:-}" != skip ]; then
  bash "$(dirname "$0")/coredns.sh" >/dev/null
fi
