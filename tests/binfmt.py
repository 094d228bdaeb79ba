"""arm64 programs run here under emulation for as long as a build or a run needs them, and not after (issue 42).

The kernel's binfmt_misc table is machine-wide, so the harness changes it as little as it can: it registers
`qemu-aarch64` only when the machine has no entry for it, from Debian's qemu-user-static (`/usr/lib/binfmt.d`'s
magic and mask, the static interpreter, flags OCF: F opens the interpreter now, so a container's root filesystem
needs no copy of it), and removes only what it registered, when the last of the runs using it is done (builds and a
node's Pods may overlap). A machine that already emulates arm64 (binfmt-support, systemd-binfmt) is used as it is.

    python -m tests.binfmt on|off|status     (a shell script's way: `on` prints a holder id that `off` takes)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

BINFMT = Path("/proc/sys/fs/binfmt_misc")
ENTRY = "qemu-aarch64"
CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
INTERPRETER = Path("/usr/bin/qemu-aarch64-static")
FLAGS = "OCF"
# Who holds the emulation now (one file per holder, named by its pid), and whether this harness registered it.
STATE = Path(os.environ.get("HOMELAB_BINFMT_STATE", "/run/homelab-autoscaler-binfmt"))


class Unavailable(RuntimeError):
    """arm64 cannot be emulated here: the reason names the package or the permission missing."""


def registration(conf: str, interpreter: Path = INTERPRETER, flags: str = FLAGS) -> str:
    """The line written to binfmt_misc's `register`: the conf's name, type, offset, magic and mask, with the
    static interpreter and the flags a container needs (pure: tests/test_binfmt.py)."""
    line = next((ln.strip() for ln in conf.splitlines() if ln.strip() and not ln.startswith("#")), "")
    fields = line.split(":")
    if len(fields) != 8 or fields[0] != "" or fields[2] != "M":
        raise ValueError(f"{CONF}: not a binfmt_misc magic entry (:name:M:offset:magic:mask:interpreter:flags): "
                         f"{line!r}")  # fmt: skip
    fields[6], fields[7] = str(interpreter), flags
    return ":".join(fields)


def emulates() -> bool:
    """Whether the kernel runs arm64 programs through an enabled qemu-aarch64 entry now."""
    entry = BINFMT / ENTRY
    try:
        return entry.read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        return False


def entries() -> list[str]:
    """The binfmt_misc entries now, `name: enabled|disabled interpreter` (what the inventory compares)."""
    if not (BINFMT / "register").exists():
        return []
    out = []
    for entry in sorted(BINFMT.iterdir()):
        if entry.name in ("register", "status"):
            continue
        with contextlib.suppress(OSError):
            lines = entry.read_text().splitlines()
            interp = next((ln.split(" ", 1)[1] for ln in lines if ln.startswith("interpreter ")), "?")
            out.append(f"{entry.name}: {lines[0].strip() if lines else '?'} {interp}")
    return out


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _holders() -> list[Path]:
    """Holders still alive; a holder whose process is gone (killed mid-run) no longer counts."""
    alive = []
    for f in (STATE / "holders").glob("*") if (STATE / "holders").exists() else []:
        pid = f.name.split("-", 1)[0]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            alive.append(f)
        else:
            f.unlink(missing_ok=True)
    return alive


def acquire(pid: int | None = None) -> str:
    """arm64 emulation on for a holder (the calling process unless `pid` names a longer-lived one); its id."""
    if os.geteuid() != 0:
        raise Unavailable("arm64 emulation needs root (binfmt_misc's register is root's)")
    if not INTERPRETER.exists() or not CONF.exists():
        raise Unavailable(f"arm64 emulation needs {INTERPRETER} (apt-get install qemu-user-static)")
    with _locked():
        if not (BINFMT / "register").exists():
            subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True, timeout=30,
                           capture_output=True)  # fmt: skip
            (STATE / "mounted").touch()
        if not emulates():
            if (BINFMT / ENTRY).exists():
                raise Unavailable(f"{BINFMT / ENTRY} exists but is disabled: the machine's owner turned it off")
            (BINFMT / "register").write_text(registration(CONF.read_text()))
            (STATE / "registered").touch()
        holder = f"{pid or os.getpid()}-{os.urandom(4).hex()}"
        (STATE / "holders").mkdir(exist_ok=True)
        (STATE / "holders" / holder).touch()
        return holder


def release(holder: str) -> bool:
    """The holder done; the entry (and the mount) removed when this harness made them and no holder is left.
    Whether it was removed."""
    with _locked():
        (STATE / "holders" / holder).unlink(missing_ok=True)
        if _holders():
            return False
        removed = False
        if (STATE / "registered").exists():
            with contextlib.suppress(FileNotFoundError):
                (BINFMT / ENTRY).write_text("-1")
            (STATE / "registered").unlink()
            removed = True
        if (STATE / "mounted").exists():
            subprocess.run(["umount", str(BINFMT)], check=False, timeout=30, capture_output=True)
            (STATE / "mounted").unlink()
        return removed


@contextlib.contextmanager
def arm64() -> Iterator[None]:
    """arm64 programs run for the length of the block."""
    holder = acquire()
    try:
        yield
    finally:
        release(holder)


def main(argv: list[str]) -> int:
    if argv[:1] == ["on"]:
        # The holder is the caller's shell (our parent), so a script killed before `off` is not counted forever.
        print(acquire(os.getppid()))
    elif argv[:1] == ["off"] and len(argv) == 2:
        print("removed" if release(argv[1]) else "kept")
    elif argv[:1] == ["status"]:
        print("\n".join(entries()) or "no binfmt_misc entries")
    else:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
