"""A machine's state directory, shared by the peers (each a separate process) and the harness: the power the BMC
(or the plug, the NIC, the OS) says, the firmware settings, and a log of what happened. Standard library only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

POWER = "power"
EVENTS = "events.log"
CONFIG = "config.json"
ACPI = "acpi-request"  # the BMC pressed the power button (IPMI soft, Redfish GracefulShutdown): the OS shuts down
DEFAULTS: dict[str, Any] = {"wakes_on_lan": True, "boots": True, "ac_power_on": True}


def write(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def power(state: Path) -> str:
    try:
        return (state / POWER).read_text().strip() or "off"
    except FileNotFoundError:
        return "off"


def set_power(state: Path, value: str, source: str, why: str = "") -> bool:
    """Set the power; False when it already was so (nothing logged)."""
    if value not in ("on", "off"):
        raise ValueError(f"power {value!r}: on or off")
    if power(state) == value:
        return False
    write(state / POWER, value)
    event(state, source, f"power {value}" + (f": {why}" if why else ""))
    return True


def event(state: Path, source: str, text: str) -> None:
    with (state / EVENTS).open("a") as out:
        out.write(f"{time.time():.3f} {source} {text}\n")


def config(state: Path) -> dict[str, Any]:
    try:
        return {**DEFAULTS, **json.loads((state / CONFIG).read_text())}
    except FileNotFoundError:
        return dict(DEFAULTS)
