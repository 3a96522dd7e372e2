#!/usr/bin/env bash
# Installs everything the tests, the differential tests and the benchmarks
# need, on top of what the main job needs (scripts/setup.sh). .ci/run calls
# it. Idempotent; run as root.
set -euo pipefail
here=$(dirname "$0")
bash "$here/setup.sh"
. "$here/lib/apt.sh"

PKGS=(
  iptables                                   # tests inspect the host's legacy tables
  containernetworking-plugins                # reference CNI plugins (differential tests, bench)
  podman runc busybox-static                 # a real CNI runtime, and a rootfs for its containers
  containerd                                 # a real CRI runtime (podnet/tests/cri.rs; pause image: scripts/pause-image.sh)
  etcd-server                                # the etcd store's tests
  dnsutils iperf3 iputils-ping               # DNS and data-plane checks (ping -M do), benchmarks
  tcpdump                                    # the encrypted overlay's check: no pod payload in clear on the underlay
  dnsperf unbound                            # dns-bench: load generator and the resolver we compare with
  chromium                                   # a real headless browser for the web view's test (podnet/tests/ui.rs)
  libseccomp-dev gcc libc6-dev pkg-config    # runc with seccomp, upstream's pause (scripts/node-peers.sh, e2e-images.sh)
  netcat-openbsd socat nginx wget            # the tools of upstream's test images, offline (scripts/e2e-images.sh)
  bird2 frr                                  # real BGP peers (crates/bgp/tests: interop with BIRD and FRR's bgpd)
)
apt_install "${PKGS[@]}"

# Real Kubernetes peers for the Kubernetes-mode tests (kube lab, differential
# tests): kube-apiserver, kube-controller-manager and kubectl, plus kube-proxy
# (podnet/tests/kubeproxy_diff.rs diffs podnet's proxy against it; the same
# k8s.io/kubernetes module, so little more to build), built from Go modules
# and cached by version under /var/cache/podnet-peers. Cold: about 10 minutes
# on 2 cores; warm: a fraction of a second. Tests find them through the same
# script (PODNET_K8S_PEERS=skip leaves them out).
if [ "${PODNET_K8S_PEERS:-}" != skip ]; then
  bash "$here/k8s-peers.sh" kube-apiserver kube-controller-manager kubectl kube-proxy >/dev/null
fi

# Real nodes for `podnet lab up --kubelet` (podnet/tests/kubelet_lab.rs and
# kubelet_upgrade.rs) and upstream's e2e.test for CI's slice of its suites
# (podnet/tests/e2e_smoke.rs): kubelet, kube-scheduler, agnhost and e2e.test
# from the same k8s.io/kubernetes module, containerd 2.4, runc 1.5 and
# crictl (scripts/node-peers.sh), cached the same way.
if [ "${PODNET_K8S_PEERS:-}" != skip ]; then
  bash "$here/k8s-peers.sh" kubelet kube-scheduler agnhost e2e.test >/dev/null
  bash "$here/node-peers.sh" >/dev/null
fi

# The real CoreDNS, the peer of the cluster-DNS differential test
# (podnet/tests/coredns_diff.rs) and of coredns-bench: built from Go modules
# and cached by version under /var/cache/podnet-peers (cold: about 8 minutes
# on 2 cores; warm: a fraction of a second). PODNET_COREDNS=skip leaves it out.
if [ "${PODNET_COREDNS:-}" != skip ]; then
  bash "$here/coredns.sh" >/dev/null
fi

# Upstream's Gateway API conformance suite v1.6.3 with echo-basic and the
# images its manifests run (podnet/tests/gateway_conformance.rs), and the
# standard-channel CRDs the kube lab installs before the L7 gateway starts
# (podnet/tests/gateway.rs): built from Go modules and cached by version
# (cold: a few minutes, CoreDNS v1.12.2's image among them).
bash "$here/gateway-conformance.sh" >/dev/null
