"""The machine room's network: a LAN bridge inside a network namespace of its own and one namespace per host on it
(a machine's operating system, its BMC, a smart plug, the node a power Job runs on), joined by veth pairs. The
host's own namespace gains nothing: no bridge, no address, no route, no firewall rule; every namespace is named
`hlmr-<run>-<host>` and deleted at the end, and `leftovers()` proves it.

Addresses come from 198.18.0.0/15 (RFC 2544, set aside for network tests), which no real network routes: the LAN
is 198.18.0.0/24, a pod network behind the node is 198.19.0.0/24. The LAN has no way out of its namespaces.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "hlmr"
LAN_CIDR = ipaddress.ip_network("198.18.0.0/24")
POD_CIDR = ipaddress.ip_network("198.19.0.0/24")
NETNS_DIR = Path("/run/netns")
# Each run writes its harness's PID here, so a later run can remove what a killed one left (and nothing else).
RUNS_DIR = Path("/run/hlmr")
TIMEOUT = 30


def sh(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One bounded command; a failure raises with the command and what it said."""
    done = subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def netns_names() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_dead_runs() -> list[str]:
    """Delete the namespaces of runs whose harness is gone (killed before its teardown); returns what went."""
    removed: list[str] = []
    if not RUNS_DIR.is_dir():
        return removed
    for pidfile in RUNS_DIR.glob("*.pid"):
        run = pidfile.stem
        with contextlib.suppress(ValueError, OSError):
            if _alive(int(pidfile.read_text().strip())):
                continue
        for name in netns_names():
            if name.startswith(f"{PREFIX}-{run}-"):
                sh("ip", "netns", "del", name, check=False)
                removed.append(name)
        pidfile.unlink(missing_ok=True)
    return removed


def masquerade_rules(cidr: str, iface: str) -> str:
    """nft's table masquerading a pod network's packets leaving on `iface` (what a CNI bridge's ipMasq does)."""
    network = ipaddress.ip_network(cidr)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", iface):
        raise ValueError(f"interface name {iface!r}: at most 15 letters, digits, '_', '.' or '-'")
    return (
        "table ip hlmr_nat {\n chain postrouting {\n  type nat hook postrouting priority srcnat; policy accept;\n"
        f'  ip saddr {network} oifname "{iface}" masquerade\n }}\n}}\n'
    )


@dataclass(frozen=True)
class Host:
    """One host on the LAN: its namespace, its interface and its address (and MAC: a wake-on-LAN NIC has one)."""

    name: str
    netns: str
    address: str
    mac: str

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    def exec(self, *args: str) -> list[str]:
        """A command line that runs `args` inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]


@dataclass
class Lan:
    """The bridge and its hosts. `up()` builds it, `down()` removes every namespace it made."""

    run: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)
    _next: int = 10

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.run}-lan"

    @property
    def gateway(self) -> str:
        return str(LAN_CIDR.network_address + 1)

    def up(self) -> Lan:
        reap_dead_runs()
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        (RUNS_DIR / f"{self.run}.pid").write_text(str(os.getpid()))
        self._add_netns(self.netns)
        lan = ["ip", "-n", self.netns]
        sh(*lan, "link", "set", "lo", "up")
        sh(*lan, "link", "add", "br0", "type", "bridge")
        sh(*lan, "addr", "add", f"{self.gateway}/{LAN_CIDR.prefixlen}", "dev", "br0")
        sh(*lan, "link", "set", "br0", "up")
        return self

    def _add_netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.made.append(name)

    def host(self, name: str, *, mac: str | None = None, address: bool = True) -> Host:
        """A namespace `hlmr-<run>-<name>` with `eth0` on the bridge; `address=False` leaves it without one (a
        machine that is off: its NIC still sees frames, nothing answers)."""
        if not re.fullmatch(r"[a-z0-9-]{1,40}", name):
            raise ValueError(f"host name {name!r}: lowercase letters, digits and '-' only")
        if name in self.hosts:
            raise ValueError(f"host {name!r} is already on the LAN")
        index = self._next
        self._next += 1
        netns = f"{PREFIX}-{self.run}-{name}"
        mac = mac or f"02:68:6c:00:00:{index:02x}"
        self._add_netns(netns)
        port = f"p{index}"
        sh("ip", "-n", self.netns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "-n", self.netns, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        sh("ip", "-n", netns, "link", "set", "eth0", "address", mac, "up")
        host = Host(name, netns, str(LAN_CIDR.network_address + index), mac)
        if address:
            self.address_up(host)
        self.hosts[name] = host
        return host

    def join(self, name: str, netns: str, *, iface: str = "hlmr0", masquerade: str = "") -> Host:
        """A namespace made by someone else (a real node's) joins the LAN as host `name`: a veth from the bridge to
        `iface` there, an address on the LAN and a route for the limited broadcast (a wake-on-LAN packet to
        255.255.255.255 leaves there; the namespace needs no default route). `masquerade`, a pod network's CIDR,
        is masqueraded onto the LAN, as a CNI bridge's ipMasq does. The namespace stays its owner's: `down()` takes
        the veth away with the bridge, nothing else."""
        if not re.fullmatch(r"[a-z0-9-]{1,40}", name) or name in self.hosts:
            raise ValueError(f"host name {name!r}: new, lowercase letters, digits and '-' only")
        if not (NETNS_DIR / netns).exists():
            raise ValueError(f"network namespace {netns!r} does not exist (it is its owner's to make)")
        index = self._next
        self._next += 1
        port = f"p{index}"
        mac = f"02:68:6c:00:00:{index:02x}"
        sh("ip", "-n", self.netns, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", netns)
        sh("ip", "-n", self.netns, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", netns, "link", "set", iface, "address", mac, "up")
        host = Host(name, netns, str(LAN_CIDR.network_address + index), mac)
        sh("ip", "-n", netns, "addr", "add", f"{host.address}/{LAN_CIDR.prefixlen}", "dev", iface)
        sh("ip", "-n", netns, "route", "replace", "255.255.255.255/32", "dev", iface)
        if masquerade:
            sh(*host.exec("nft", "-f", "-"), input=masquerade_rules(masquerade, iface))
        self.hosts[name] = host
        return host

    def address_up(self, host: Host) -> None:
        sh("ip", "-n", host.netns, "addr", "replace", f"{host.address}/{LAN_CIDR.prefixlen}", "dev", "eth0")
        sh("ip", "-n", host.netns, "route", "replace", "default", "via", self.gateway)

    def address_down(self, host: Host) -> None:
        sh("ip", "-n", host.netns, "addr", "flush", "dev", "eth0")

    def link(self, host: Host, up: bool) -> None:
        """The host's cable: plugged in or pulled (a BMC that does not answer)."""
        sh("ip", "-n", host.netns, "link", "set", "eth0", "up" if up else "down")

    def pod_network(self, node: Host) -> Host:
        """A pod's namespace behind `node`, as a CNI bridge plugin makes it: its own address, routed and masqueraded
        by the node, so a pod reaches the LAN by unicast and never by broadcast."""
        netns = f"{PREFIX}-{self.run}-{node.name}-pod"
        self._add_netns(netns)
        gateway, pod = str(POD_CIDR.network_address + 1), str(POD_CIDR.network_address + 2)
        sh("ip", "-n", node.netns, "link", "add", "cni0", "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "-n", node.netns, "addr", "add", f"{gateway}/{POD_CIDR.prefixlen}", "dev", "cni0")
        sh("ip", "-n", node.netns, "link", "set", "cni0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        sh("ip", "-n", netns, "addr", "add", f"{pod}/{POD_CIDR.prefixlen}", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "route", "add", "default", "via", gateway)
        sh(*node.exec("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"))
        sh(*node.exec("nft", "-f", "-"), input=masquerade_rules(str(POD_CIDR), "eth0"))
        return Host(f"{node.name}-pod", netns, pod, "")

    def down(self) -> None:
        """Delete every namespace this LAN made (the bridge and veths go with them)."""
        for name in reversed(self.made):
            sh("ip", "netns", "del", name, check=False)
        self.made.clear()
        (RUNS_DIR / f"{self.run}.pid").unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """What of this run is still there: its namespaces (an empty list after `down()`)."""
        return [n for n in netns_names() if n.startswith(f"{PREFIX}-{self.run}-")]
