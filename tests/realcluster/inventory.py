"""What a run of the real node could leave on the machine, taken before and after, and the difference said.

The machine is shared (other engineers' processes come and go), so the inventory is of the kinds of thing only a
node makes: network namespaces (named ones and any a process or mount holds), the links, nft tables and iptables
rules of the machine's own namespace, mounts, cgroups under the run's cgroup root, files under the paths a kubelet
or containerd writes outside its own directories, processes that are in another network namespace than the
machine's or name the run's prefix, and binfmt_misc's entries (the arm64 emulation of issue 42). A second run right
after the first must find the same inventory as before it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests import binfmt

# Paths a kubelet or containerd may write outside the directories the harness gives them.
STRAY_DIRS = ("/var/log/containers", "/var/log/pods", "/run/containerd", "/var/run/netns", "/var/lib/kubelet",
              "/etc/cni/net.d", "/opt/cni", "/var/lib/cni")  # fmt: skip


@dataclass(frozen=True)
class Inventory:
    """One snapshot; every field a sorted tuple of lines, so two compare and print plainly."""

    netns: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    nft_tables: tuple[str, ...] = ()
    iptables: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    cgroups: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    processes: tuple[str, ...] = ()
    sysctls: tuple[str, ...] = ()
    binfmt: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default=(), compare=False)

    def kinds(self) -> dict[str, tuple[str, ...]]:
        return {k: getattr(self, k) for k in ("netns", "links", "nft_tables", "iptables", "mounts", "cgroups",
                                              "files", "processes", "sysctls", "binfmt")}  # fmt: skip


def diff(before: Inventory, after: Inventory) -> dict[str, tuple[list[str], list[str]]]:
    """Per kind, what appeared and what vanished; kinds with no change are left out."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    b, a = before.kinds(), after.kinds()
    for kind in b:
        added = sorted(set(a[kind]) - set(b[kind]))
        removed = sorted(set(b[kind]) - set(a[kind]))
        if added or removed:
            out[kind] = (added, removed)
    return out


# What a node makes without naming it: Pods' network namespaces, veth ends, shim sockets, log links, and the arm64
# emulation its images and Pods use (tests/binfmt.py removes it when the last run using it ends).
UNNAMED_NODE_THINGS = ("cni-", "veth", " = ", "/run/containerd", "/var/log/containers", "/var/log/pods", "/var/lib/cni",
                       "/var/lib/kubelet", "/etc/cni", "/opt/cni", "kubepods", f"{binfmt.ENTRY}: ")  # fmt: skip


def attributable(item: str, markers: Iterable[str]) -> bool:
    """A change the run made: it names one of the run's markers (its prefix, its directory) or is of a kind only a
    node makes unnamed. The machine is shared: whatever else appeared meanwhile is someone else's."""
    return any(m in item for m in (*markers, *UNNAMED_NODE_THINGS))


def left_behind(changes: Mapping[str, tuple[list[str], list[str]]], markers: Iterable[str]
                ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:  # fmt: skip
    """What appeared and stayed, split into the run's and the rest (someone else's, said but not held against it)."""
    ours: dict[str, list[str]] = {}
    theirs: dict[str, list[str]] = {}
    marks = tuple(markers)
    for kind, (added, _removed) in changes.items():
        for item in added:
            (ours if attributable(item, marks) else theirs).setdefault(kind, []).append(item)
    return ours, theirs


def describe(changes: Mapping[str, tuple[list[str], list[str]]]) -> str:
    """The difference as lines a person reads ('' when there is none)."""
    lines: list[str] = []
    for kind, (added, removed) in changes.items():
        lines += [f"{kind}: left behind: {x}" for x in added]
        lines += [f"{kind}: gone since before: {x}" for x in removed]
    return "\n".join(lines)


# --- parsing (pure: the unit tests feed them text) ------------------------------------------------------------------
def parse_links(text: str) -> list[str]:
    """`ip -o link` → 'name kind-ish' per link, without counters or indexes that change between runs."""
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        name = parts[1].strip().split("@", 1)[0]
        found.append(name)
    return sorted(found)


def parse_nft_tables(text: str) -> list[str]:
    """`nft list tables` → 'family name' per table."""
    return sorted(" ".join(line.split()[1:3]) for line in text.splitlines() if line.startswith("table "))


def parse_iptables_save(text: str) -> list[str]:
    """`iptables-save` → its rules and chains (tables' headers and counters dropped; `:CHAIN POLICY`)."""
    found, table = [], ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            found.append(f"{table} {line.split()[0]}")
        elif line.startswith("-A"):
            found.append(f"{table} {line}")
    return sorted(found)


def parse_mountinfo(text: str) -> list[str]:
    """/proc/self/mountinfo → 'mountpoint fstype' per mount."""
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        if len(fields) < 5:
            continue
        fstype = right.split()[0] if right.split() else "?"
        found.append(f"{_unescape(fields[4])} {fstype}")
    return sorted(found)


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def interesting_process(cmdline: str, netns: str, home_netns: str, markers: Iterable[str]) -> bool:
    """A process of a node: in another network namespace than the machine's, or naming one of the markers."""
    return netns != home_netns or any(m in cmdline for m in markers)


# --- reading the machine ---------------------------------------------------------------------------------------------
def _run(args: list[str], errors: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        errors.append(f"{' '.join(args)}: {exc}")
        return ""
    if done.returncode != 0:
        errors.append(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout


def _netns_of(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _processes(home: str, markers: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Processes of a node, and the network namespaces any process holds other than the machine's."""
    procs, spaces = [], set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        ns = _netns_of(entry.name)
        try:
            raw = Path(f"/proc/{entry.name}/cmdline").read_bytes()
        except OSError:
            continue
        if not raw:  # a kernel thread
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if ns and ns != home:
            spaces.add(f"held by a process: {ns}")
        if interesting_process(cmd, ns or home, home, markers):
            procs.append(f"{entry.name} {cmd[:160]}")
    return sorted(procs), sorted(spaces)


def _cgroups(cgroup_names: tuple[str, ...]) -> list[str]:
    found = []
    root = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        for hierarchy in root.iterdir():
            for name in cgroup_names:
                p = hierarchy / name.strip("/")
                if p.exists():
                    found.append(str(p))
    return sorted(found)


# The machine-wide kernel settings a kubelet or kube-proxy may set (namespaced ones go with the node's namespace).
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/netfilter/nf_conntrack_max")  # fmt: skip


def _sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = (Path("/proc/sys") / name).read_text().strip()
    return out


def _files() -> list[str]:
    found = []
    for d in STRAY_DIRS:
        p = Path(d)
        if not p.exists():
            continue
        found.append(f"{d}/")
        with contextlib.suppress(OSError):
            for child in p.rglob("*"):
                found.append(str(child))
    return sorted(found)


def take(*, markers: tuple[str, ...] = ("hlas-",), cgroup_names: tuple[str, ...] = ()) -> Inventory:
    """The machine's inventory now. `markers`: strings a node's processes and namespaces are named with."""
    errors: list[str] = []
    home = _netns_of("self")
    procs, held = _processes(home, markers)
    named = [f"named: {n.split()[0]}" for n in _run(["ip", "netns", "list"], errors).splitlines() if n.strip()]
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    nsfs = [f"mounted: {m}" for m in mounts if m.endswith(" nsfs")]
    iptables = parse_iptables_save(_run(["iptables-save"], errors)) if _has("iptables-save") else []
    return Inventory(
        netns=tuple(sorted({*named, *held, *nsfs})),
        links=tuple(parse_links(_run(["ip", "-o", "link"], errors))),
        nft_tables=tuple(parse_nft_tables(_run(["nft", "list", "tables"], errors))) if _has("nft") else (),
        iptables=tuple(iptables),
        mounts=tuple(mounts),
        cgroups=tuple(_cgroups(cgroup_names)),
        files=tuple(_files()),
        processes=tuple(procs),
        sysctls=tuple(f"{k} = {v}" for k, v in sorted(_sysctls().items())),
        binfmt=tuple(binfmt.entries()),
        errors=tuple(errors),
    )


def _has(tool: str) -> bool:
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).exists()
