#!/usr/bin/env bash
# The main job: a 3-node cluster on this machine (network namespaces, real
# agents, the real CNI plugins), pods on different nodes reaching each other.
# Usage: bash scripts/lab-demo.sh [vxlan|host-gw|udp]   (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
P=./target/release/podnet
[ -x "$P" ] || cargo build --release
BACKEND=${1:-vxlan}

$P lab down >/dev/null
$P lab up --nodes 3 --backend "$BACKEND"
for i in 1 2 3; do
  $P lab run default/pod$i --node node$i --ports 8080/tcp,8081/udp --labels app=demo
done
ip_of() { python3 -c "import json;print(json.load(open('/run/podnet-lab/lab/pods/default_$1.json'))['ip'])"; }
echo
echo "== every pod asks every other pod, over TCP and UDP, who it is and what client IP it saw"
for i in 1 2 3; do for j in 1 2 3; do
  [ "$i" = "$j" ] && continue
  ip=$(ip_of pod$j)
  printf 'pod%s -> pod%s (%s): tcp says %-5s udp says %-5s client ip seen %s\n' "$i" "$j" "$ip" \
    "$($P lab probe default/pod$i "$ip:8080")" \
    "$($P lab probe default/pod$i "$ip:8081/udp")" \
    "$($P lab probe default/pod$i "$ip:8080" --ask clientip)"
done; done
echo
echo "== node1's routes to the other nodes' pod subnets ($BACKEND)"
ip netns exec pn-lab-node1 ip route show proto 112
echo
echo "== cluster state"
$P --store sqlite:///run/podnet-lab/lab/state.db get nodes -o wide
$P --store sqlite:///run/podnet-lab/lab/state.db get pods -o wide
echo
echo "The lab is still up: try 'podnet lab exec default/pod1 -- ip addr', then 'podnet lab down'."
