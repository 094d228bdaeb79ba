#!/usr/bin/env bash
# What the machine room and the power images need, installed by the project (idempotent; run by `make e2e-power`):
# Debian's packages (OpenIPMI's ipmi_sim, runc, buildah, mmdebstrap, iproute2, nftables; qemu-user-static and
# arch-test for the images' arm64 builds, issue 42), and a Python of the
# machine room's own with sushy-tools (the Redfish emulator; bcrypt for its htpasswd), kept out of the project's
# virtualenv. Prints that Python's directory last.
#
#   tests/machineroom/setup.sh           install what is missing, print the directory
#   tests/machineroom/setup.sh --where   print the directory only
set -euo pipefail
SUSHY_TOOLS_VERSION=2.2.0
root=${XDG_CACHE_HOME:-$HOME/.cache}/homelab-autoscaler/machineroom
venv="$root/venv-sushy-tools-$SUSHY_TOOLS_VERSION"
if [[ "${1:-}" == "--where" ]]; then
  echo "$venv"
  exit 0
fi
packages=(openipmi runc buildah mmdebstrap iproute2 nftables util-linux qemu-user-static arch-test)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
mkdir -p "$root"
exec 9>"$root/.lock"
flock -w 600 9
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import sushy_tools, bcrypt" 2>/dev/null; then
  echo "setup.sh: making $venv (sushy-tools $SUSHY_TOOLS_VERSION)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "sushy-tools==$SUSHY_TOOLS_VERSION" >&2
fi
echo "$venv"
