#!/usr/bin/env bash
# Install the real node's host packages from Debian (idempotent: installs only what is missing).
#
#   runc                         the OCI runtime containerd's shim calls (crun refuses hybrid cgroups)
#   containernetworking-plugins  the CNI plugins bridge, host-local and loopback (/usr/lib/cni)
#   mmdebstrap                   builds the base and Python image root filesystems (make images)
#   nftables                     kube-proxy's nftables mode, and the teardown's check for leftover rules
#   conntrack                    kube-proxy clears stale UDP conntrack entries with it
#   iptables ipset               kube-router's firewall (NetworkPolicies), and the teardown's check that no
#                                iptables rule was left behind
#   cmake make g++ binutils      build llama.cpp's llama-server, the e2e suite's real model server
set -euo pipefail
PACKAGES=(runc containernetworking-plugins mmdebstrap nftables conntrack iptables ipset cmake make g++ binutils)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "node-deps: all present (${PACKAGES[*]})" >&2
  exit 0
fi
[[ $(id -u) -eq 0 ]] || { echo "node-deps: error: installing ${missing[*]} needs root" >&2; exit 1; }
echo "node-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || {
  echo "node-deps: apt-get install failed; try 'apt-get update' first" >&2
  exit 1
}
