#!/usr/bin/env bash
# Installs what the main job needs (README's first command: build podnet and
# run the lab) and nothing more. The tests, differential tests and
# benchmarks need more: scripts/test-setup.sh installs that (.ci/run calls
# it). Idempotent: packages already present are not touched, apt is only
# consulted when something is missing. Run as root.
set -euo pipefail
here=$(dirname "$0")
. "$here/lib/apt.sh"

PKGS=(
  iproute2 nftables conntrack                # the lab's namespaces, links, rules and conntrack reads
  protobuf-compiler libprotobuf-dev          # the etcd-client build (protoc + well-known protos)
  python3                                    # lab-demo.sh reads the pods' IPs from their JSON
)
apt_install "${PKGS[@]}"

command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
