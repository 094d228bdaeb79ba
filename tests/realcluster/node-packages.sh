#!/usr/bin/env bash
# The Debian packages the real node and its images need (`make e2e-pods`), installed when missing (root only):
# containerd and runc run the Pods, the CNI plugins wire them, nftables/iptables are kube-proxy's tools,
# buildah/mmdebstrap/skopeo build the images, docker-registry serves them, busybox-static is the small tools' image.
# qemu-user-static runs the arm64 builds' RUN steps and arm64 Pods under emulation (tests/binfmt.py registers it for
# the run); arch-test is how mmdebstrap checks that it can.
set -euo pipefail
packages=(containerd runc containernetworking-plugins nftables iptables buildah mmdebstrap skopeo docker-registry
  busybox-static conntrack qemu-user-static arch-test)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "node-packages.sh: missing ${missing[*]} and not root: install them with apt-get" >&2
  exit 2
fi
echo "node-packages.sh: installing ${missing[*]}" >&2
apt-get update -qq
# No service is started by the install: the harness runs containerd and the registry itself, in its own directories.
DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
