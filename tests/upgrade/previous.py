"""The previous release as a user has it: a wheel built from its git tag (or, before the clone holds a tag, the commit
tests/releases.py records) and installed with its own dependencies into a virtualenv of its own.

Built once per release commit and Python, under ~/.cache/homelab-autoscaler/upgrade/<version>-<commit>-py<X.Y>/
(`$XDG_CACHE_HOME` is honoured): a cold build fetches the release's dependencies through pip (its cache makes that
quick), a warm one is a stamp read. A lock keeps two runs from building the same one at once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

from tests.releases import ROOT, Release

BUILD_TIMEOUT = 900.0  # seconds a cold build may take (pip fetching the release's dependencies)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "homelab-autoscaler" / "upgrade"


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode()


def source_of(release: Release) -> str:
    """The commit to build: the release's tag when this clone has it, else the commit recorded for it."""
    if release.tag:
        try:
            return git("rev-parse", "--verify", "--quiet", f"refs/tags/{release.tag}^{{commit}}").strip()
        except RuntimeError:
            pass
    try:
        return git("rev-parse", "--verify", "--quiet", f"{release.commit}^{{commit}}").strip()
    except RuntimeError as err:
        raise RuntimeError(
            f"release {release.version}: neither tag {release.tag or '(none)'} nor commit {release.commit} is in this"
            " clone (a shallow clone? `git fetch --unshallow --tags`)"
        ) from err


def previous_operator(release: Release) -> Path:
    """The previous release's `homelab-autoscaler` console script, built (once) in its own virtualenv."""
    commit = source_of(release)
    home = cache_root() / f"{release.version}-{commit[:12]}-py{sys.version_info.major}.{sys.version_info.minor}"
    script = home / "venv" / "bin" / "homelab-autoscaler"
    stamp = home / "installed"
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and script.exists():
            return script
        shutil.rmtree(home, ignore_errors=True)
        _build(commit, home)
        stamp.write_text(f"{release.version} {commit}\n")
    return script


def _build(commit: str, home: Path) -> None:
    """git archive of the commit → its wheel (no dependencies) → a fresh venv with the wheel and its dependencies."""
    began = time.monotonic()
    src, wheels, venv = home / "src", home / "wheels", home / "venv"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, timeout=120)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit}: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(src, filter="data")
    _run([sys.executable, "-m", "venv", str(venv)], "create the previous release's virtualenv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    _run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(src)], f"build the wheel of {commit[:12]}")
    (wheel,) = wheels.glob("homelab_autoscaler-*.whl")
    _run([*pip, "install", str(wheel)], f"install {wheel.name} and its dependencies")
    _run([str(venv / "bin" / "homelab-autoscaler"), "--help"], "run the previous release's console script")
    shutil.rmtree(src)
    print(f"built the previous release {commit[:12]} in {time.monotonic() - began:.0f} s: {venv}", flush=True)


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, timeout=BUILD_TIMEOUT)
    if done.returncode != 0:
        out = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
        raise RuntimeError(f"could not {what} (exit {done.returncode}):\n{out}")
