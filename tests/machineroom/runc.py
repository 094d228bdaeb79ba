"""Containers run by Debian's runc from an image's unpacked root filesystem (tests/machineroom/images.sh), in a
network namespace of the machine room: the machines' operating systems (sshd) and, on the script side
(test_power.py), the power Jobs' containers. The root filesystem is an overlay (the image read-only below, a writable
layer above), as containerd gives a container; the capabilities are containerd's default set. Each container is
stopped and deleted by its id, its overlay unmounted and its directories removed, and `leftovers()` proves it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNC_ROOT = Path("/run/hlmr-runc")
# containerd's default capabilities (oci.defaultUnixCaps), which a Pod gets without a securityContext.
DEFAULT_CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]  # fmt: skip
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host path into the container."""

    source: Path
    destination: str
    readonly: bool = True


def _mount(destination: str, kind: str, source: str, options: list[str]) -> dict[str, Any]:
    return {"destination": destination, "type": kind, "source": source, "options": options}


def config(args: list[str], env: dict[str, str], rootfs: Path, netns: str, hostname: str,
           mounts: list[Mount]) -> dict[str, Any]:  # fmt: skip
    """The OCI runtime configuration of one container (pure: tests/test_machineroom.py checks it)."""
    caps = list(DEFAULT_CAPS)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": [f"{k}={v}" for k, v in {"PATH": PATH, "HOSTNAME": hostname, **env}.items()],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": False,
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": hostname,
        "mounts": [
            _mount("/proc", "proc", "proc", []),
            _mount("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
            _mount("/dev/pts", "devpts", "devpts", ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]),
            _mount("/dev/shm", "tmpfs", "shm", ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
            _mount("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
            _mount("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
            *[_mount(m.destination, "bind", str(m.source), ["rbind", "ro" if m.readonly else "rw"]) for m in mounts],
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
                {"type": "network", "path": netns},
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


@dataclass
class Container:
    """One container: `start()`, then `wait()` or `stop()`; `remove()` always (idempotent)."""

    id: str
    image_rootfs: Path
    workdir: Path
    args: list[str]
    netns: str
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    hostname: str = "power"
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    @property
    def log(self) -> Path:
        return self.workdir / "container.log"

    @property
    def rootfs(self) -> Path:
        return self.workdir / "rootfs"

    def start(self) -> Container:
        for d in ("upper", "work", "rootfs", "bundle"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={self.image_rootfs},upperdir={self.workdir / 'upper'},workdir={self.workdir / 'work'}"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(self.rootfs)], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
        cfg = config(self.args, self.env, self.rootfs, self.netns, self.hostname, self.mounts)
        (self.workdir / "bundle" / "config.json").write_text(json.dumps(cfg, indent=1))
        RUNC_ROOT.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                ["runc", "--root", str(RUNC_ROOT), "run", "--bundle", str(self.workdir / "bundle"), self.id],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started = time.monotonic()
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None when it ran past `timeout` (then it is killed, as activeDeadlineSeconds does)."""
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return None

    def stop(self, grace: float = 5.0) -> None:
        if not self.alive:
            return
        for sig, wait in (("TERM", grace), ("KILL", 10.0)):
            subprocess.run(["runc", "--root", str(RUNC_ROOT), "kill", self.id, sig], capture_output=True, timeout=30)
            assert self.popen is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(wait)
                return

    def remove(self) -> None:
        """Stop, delete from runc, unmount, remove the directory: nothing of it stays."""
        self.stop()
        subprocess.run(["runc", "--root", str(RUNC_ROOT), "delete", "--force", self.id], capture_output=True,
                       timeout=30)  # fmt: skip
        if self.rootfs.is_mount():
            subprocess.run(["umount", str(self.rootfs)], capture_output=True, timeout=30, check=True)
        shutil.rmtree(self.workdir / "upper", ignore_errors=True)
        shutil.rmtree(self.workdir / "work", ignore_errors=True)


def leftovers(prefix: str) -> list[str]:
    """Containers runc still knows whose id starts with `prefix`, and overlay mounts under a path holding it."""
    found: list[str] = []
    if RUNC_ROOT.is_dir():
        found += [f"runc container {p.name}" for p in RUNC_ROOT.iterdir() if p.name.startswith(prefix)]
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            target = line.split()[1]
            if prefix in target:
                found.append(f"mount {target}")
    return found
