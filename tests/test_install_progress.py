"""`make run`'s install says what it does (tools/pip-install.sh): one line per requirement pip collects, a line when
it installs them, no setuptools "Editable installation" box, and pip's exit status. A stand-in pip prints what pip
prints and warns as setuptools' editable build does (a real `warnings.warn`, so the filter is Python's own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "pip-install.sh"
BOX = "Please be careful with folders in your working directory"
FAKE_PIP = f"""#!{sys.executable}
import os, sys, warnings
print("Collecting temporalio>=1.20 (from homelab-autoscaler==0.1)", flush=True)
print("  Using cached temporalio-1.35.0-cp39-abi3-manylinux_2_28_x86_64.whl", flush=True)
print("Collecting click>=8.1", flush=True)
print("Building wheels for collected packages: homelab-autoscaler", flush=True)
warnings.warn("Editable installation.\\n!!\\n\\n    ****\\n    {BOX}\\n    ****\\n!!", UserWarning)
print("Installing collected packages: click, temporalio, homelab-autoscaler", flush=True)
if os.environ.get("FAKE_PIP_FAILS"):
    print("ERROR: Could not find a version that satisfies the requirement nope", file=sys.stderr)
    sys.exit(1)
print("Successfully installed click-8.1 temporalio-1.35.0 homelab-autoscaler-0.1", flush=True)
"""


def install(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    pip = tmp_path / "venv" / "bin" / "pip"
    pip.parent.mkdir(parents=True)
    pip.write_text(FAKE_PIP)
    pip.chmod(0o755)
    return subprocess.run([str(SCRIPT), str(pip), "-e", ".[sim]"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})  # fmt: skip


def test_the_install_says_each_step_and_no_setuptools_box(tmp_path: Path) -> None:
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"installing into {tmp_path / 'venv'} (about a minute the first time; once after a pyproject change)",
        "  collecting temporalio>=1.20",
        "  collecting click>=8.1",
        "  installing them...",
        "  installed",
    ], done.stdout
    assert BOX not in done.stdout + done.stderr and "!!" not in done.stderr, done.stderr


def test_a_failed_install_keeps_pips_words_and_its_status(tmp_path: Path) -> None:
    done = install(tmp_path, FAKE_PIP_FAILS="1")
    assert done.returncode == 1
    assert "Could not find a version that satisfies the requirement nope" in done.stderr
    assert "installed" not in done.stdout.splitlines()[-1]


@pytest.mark.parametrize("target", ["$(RUN_STAMP):", "$(STAMP):"])
def test_both_installs_of_the_makefile_go_through_it(target: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split(f"\n{target}", 1)[1].split("\n\n", 1)[0]
    assert "tools/pip-install.sh $(BIN)/pip" in recipe and "--quiet" not in recipe, recipe
