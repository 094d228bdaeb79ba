"""Which of the ports a command is about to bind are taken, checked before it starts anything.

A second `make run` beside the first must stop at once, saying which port is taken and which flag moves it,
before it deletes a database or starts a server; a port found busy half-way through leaves a mess and, for
gRPC and the Temporal SDK's metrics, a screen of native-library noise.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from homelab_autoscaler.errors import UserError


@dataclass(frozen=True)
class Port:
    """A port a command will listen on, what listens there, and the flag that moves it."""

    host: str
    port: int
    what: str
    flag: str

    @property
    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host or '*'}:{self.port}"


def split_address(address: str) -> tuple[str, int] | None:
    """`host:port`, `[v6]:port` or `:port` as (host, port); None for what is no TCP port (`unix:`, no port)."""
    if address.startswith("unix:"):
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def in_use(host: str, port: int) -> bool:
    """True when something listens on host:port: a bind fails with EADDRINUSE.

    SO_REUSEADDR lets the probe bind past connections still in TIME_WAIT (a server that just stopped), while
    a listener, on this address or on every interface, still refuses it.
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # an unknown host fails at bind time with its own message
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            return err.errno == errno.EADDRINUSE
        return False


def check_free(ports: Iterable[Port]) -> None:
    """Raise one `UserError` naming every port asked twice or in use, and the flag that moves each."""
    wanted = [p for p in ports if p.port]
    problems: list[str] = []
    seen: dict[int, Port] = {}
    for p in wanted:
        other = seen.get(p.port)
        if other is not None and (other.host == p.host or not other.host or not p.host):
            problems.append(f"{other.flag} and {p.flag} both ask for port {p.port}")
        seen.setdefault(p.port, p)
    if problems:
        raise UserError("; ".join(problems) + ": give one of them another port")
    busy = [p for p in wanted if in_use(p.host, p.port)]
    if busy:
        listing = ", ".join(f"{p.where} ({p.what}; move it with {p.flag})" for p in busy)
        raise UserError(
            f"port{'s' if len(busy) > 1 else ''} already in use: {listing}. Is another homelab-autoscaler "
            "(`make run`) running? Stop it, or move the port"
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it), for a listener asked to take `0`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
