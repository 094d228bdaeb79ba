"""The chassis control program of ipmi_sim (OpenIPMI's `chassis_control "<program>"` in lan.conf): ipmi_sim runs
`<program> get power` and reads `power:<0|1>`; `<program> set power <0|1>` for power off/on; `<program> set
shutdown 1` for a soft shutdown (`ipmitool chassis power soft`: the ACPI power button, which the OS handles).

    python3 -m tests.machineroom.peers.chassis_control <state-dir> get|set <name> [<value>] ...
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.machineroom.peers import state


def main(argv: list[str]) -> int:
    machine, verb, rest = Path(argv[0]), argv[1], argv[2:]
    if verb == "get":
        for name in rest:
            print(f"{name}:{1 if name == 'power' and state.power(machine) == 'on' else 0}")
        return 0
    if verb != "set" or len(rest) % 2:
        print(f"chassis_control: {' '.join(argv[1:])}: get NAME... or set NAME VALUE...", file=sys.stderr)
        return 2
    for name, value in zip(rest[::2], rest[1::2], strict=True):
        if name == "power":
            state.set_power(machine, "on" if value == "1" else "off", "ipmi", f"chassis control power {value}")
        elif name == "shutdown" and value == "1":
            state.event(machine, "ipmi", "chassis control soft shutdown: the ACPI power button is pressed")
            state.write(machine / state.ACPI, "ipmi")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
