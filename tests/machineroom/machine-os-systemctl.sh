#!/bin/sh
# The machine room's systemctl: `systemctl poweroff` asks the machine room to power this machine off (as systemd
# would: the services stop, the connection drops, the power goes). Anything else is refused, as nothing else runs.
set -eu
if [ "$*" = "poweroff" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "systemctl: poweroff needs root (Access denied)" >&2; exit 1; }
  echo poweroff > /run/hlmr/os-request.tmp && mv /run/hlmr/os-request.tmp /run/hlmr/os-request
  echo "Powering off."
  exit 0
fi
echo "systemctl: only 'poweroff' is served on this machine (machine room stand-in)" >&2
exit 1
