""".ci/run's shape, with every target a fake `make` that notes when and how it ran: the builds in niced background
lanes from the start, the real tiers only once every build is in, a failed part failing the run and stopping the
lanes. CI itself is the run that proves the targets; this proves the runner (a cold CI run is an hour and more)."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.procs import ROOT

BUILDS = ("cluster-bins", "node-bins", "temporal-bins", "power-images", "prebuild")
TIERS = ("e2e-pods", "e2e-power", "e2e-real")

FAKE_MAKE = """\
#!/bin/sh
# A fake make (or python -m): notes its start and end, its niceness and the driver, fails when asked.
what="$*"
case "$what" in *tests.realcluster.prebuild*) what=prebuild ;; "") what=$(basename "$0") ;; esac
echo "start $what nice=$(nice) driver=${HOMELAB_E2E_DRIVER:-} $(date +%s.%N)" >> "$CI_FAKE_LOG"
case "$what" in
  *bins|power-images|prebuild) sleep "${CI_FAKE_BUILD_SLEEP:-0.2}" ;;
  test) sleep 2 ;;
  *) sleep 0.2 ;;
esac
echo "end $what $(date +%s.%N)" >> "$CI_FAKE_LOG"
[ "$what" != "${CI_FAKE_FAIL:-none}" ] || { echo "fake failure of $what"; exit 3; }
"""


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "tests" / "realcluster").mkdir(parents=True)
    shutil.copy2(ROOT / "tests" / "realcluster" / "versions.env", repo / "tests" / "realcluster" / "versions.env")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = [bin_dir / "make", repo / ".venv" / "bin" / "python", repo / "tests" / "machineroom" / "setup.sh"]
    for fake in fakes:
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_text(FAKE_MAKE)
        fake.chmod(0o755)
    (bin_dir / "chromium").write_text("#!/bin/sh\n")  # installed: the runner asks apt for nothing
    (bin_dir / "chromium").chmod(0o755)
    log = tmp_path / "calls"
    log.touch()
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CI_FAKE_LOG": str(log),
        "HOMELAB_CLUSTER_AUTOSCALER_SOURCE": str(tmp_path / "ca.tar.gz"),
        "TMPDIR": str(tmp_path),
        **env,
    }
    environment.pop("HOMELAB_E2E_DRIVER", None)
    done = subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, timeout=120,
                          env=environment)  # fmt: skip
    return done, [line.split() for line in log.read_text().splitlines()]


def _starts(calls: list[list[str]]) -> dict[str, list[str]]:
    return {call[1]: call for call in calls if call[0] == "start"}


def _times(calls: list[list[str]], kind: str) -> dict[str, float]:
    return {call[1]: float(call[-1]) for call in calls if call[0] == kind}


def test_the_builds_run_niced_from_the_start_and_the_tiers_once_they_are_in(tmp_path: Path) -> None:
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    starts = _starts(calls)
    assert set(starts) >= {*BUILDS, *TIERS, "test", "system", "upgrade", "fuzz", ".venv/.installed"}, starts
    for name in (*BUILDS, "fuzz"):
        assert "nice=19" in starts[name], f"{name} takes only the CPU the tests leave: {starts[name]}"
    for name in (*TIERS, "test", "system", "upgrade"):
        assert f"nice={os.nice(0)}" in starts[name], f"{name} runs at the runner's priority: {starts[name]}"
    assert "driver=ca" in starts["e2e-real"], "CI's story runs with the real cluster-autoscaler"
    began, ended = _times(calls, "start"), _times(calls, "end")
    assert all(began[b] < ended["test"] for b in ("cluster-bins", "power-images", "prebuild")), "lanes beside tests"
    assert began["prebuild"] >= ended[".venv/.installed"], "the operator's images need the project's virtualenv"
    last_build = max(ended[b] for b in BUILDS)
    assert all(began[t] >= last_build for t in TIERS), "a real tier started before every build was in"
    assert began["e2e-power"] >= ended["e2e-pods"], "the two real-node tiers never run together"
    assert began["e2e-real"] >= ended["e2e-pods"] and began["fuzz"] < ended["e2e-pods"]
    table = done.stdout[done.stdout.index("CI's parts") :]
    for part in ("cluster-bins", "operator-images", "make-test", "e2e-real", "e2e-power"):
        assert part in table, table
    assert "CI's run took" in done.stdout


@pytest.mark.parametrize("failing", ["node-bins", "prebuild"])
def test_a_failed_build_fails_the_run_before_any_tier(tmp_path: Path, failing: str) -> None:
    done, calls = _run(tmp_path, CI_FAKE_FAIL=failing)
    assert done.returncode != 0
    assert "failed (exit 3)" in done.stderr and "fake failure of " + failing in done.stdout, done.stderr[-2000:]
    assert not set(_starts(calls)) & set(TIERS), "a tier ran on a build that failed"


def test_a_failed_test_phase_stops_the_lanes(tmp_path: Path) -> None:
    """`make test` failing ends the run at once; the builds still running are stopped with their children."""
    done, calls = _run(tmp_path, CI_FAKE_FAIL="test", CI_FAKE_BUILD_SLEEP="60")
    assert done.returncode == 3, done.stderr[-2000:]
    assert "system" not in _starts(calls)
    assert {"cluster-bins", "power-images", "prebuild"} <= set(_starts(calls)), "the builds were running"
    deadline = time.monotonic() + 10
    while True:  # a process a signal ended may still be listed for a moment
        left = subprocess.run(["pgrep", "-a", "-f", str(tmp_path)], capture_output=True, text=True).stdout
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == "", f"still running 10 s after the run failed: {textwrap.shorten(left, 300)}"
