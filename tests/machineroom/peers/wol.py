"""A wake-on-LAN NIC: it reads every frame on its interface (AF_PACKET, as a NIC in standby sees the wire, whatever
the port or protocol) and wakes the machine when a frame holds the magic packet for its MAC (six 0xff bytes, then
the MAC sixteen times), unless the firmware says the machine does not wake on LAN.

    python3 -m tests.machineroom.peers.wol <interface> <mac> <state-dir>
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.machineroom.peers import state

ETH_P_ALL = 0x0003


def main(argv: list[str]) -> int:
    iface, mac_text, machine = argv[0], argv[1], Path(argv[2])
    magic = b"\xff" * 6 + bytes.fromhex(mac_text.replace(":", "")) * 16
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL)) as nic:
        nic.bind((iface, 0))
        state.event(machine, "nic", f"listening for wake-on-LAN on {iface} ({mac_text})")
        while True:
            frame = nic.recv(65535)
            if magic not in frame:
                continue
            if not state.config(machine)["wakes_on_lan"]:
                state.event(machine, "nic", "magic packet received; wake-on-LAN is disabled in the firmware: stays off")
            elif not state.set_power(machine, "on", "nic", "magic packet received"):
                state.event(machine, "nic", "magic packet received while on")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
