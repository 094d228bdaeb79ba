"""Prometheus' own lint, the one `promtool check metrics` runs (client_golang's promlint, built alone by `make
cluster-bins`: tests/realcluster/promlint), on the operator's /metrics as `homelab-autoscaler dev --simulate` serves
it after a scale-up: the SDK's metrics, the provider's, the claims' and the usage figures', the energy counters among
them. `make test` skips it until promlint is built (and says so); `make e2e-real`, which builds it first, runs this
file with HOMELAB_E2E_REAL=1, under which a missing promlint fails instead."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.procs import BIN, ROOT, free_port, port_open, wait_for
from tests.realcluster.cluster import bin_dir

CLI = str(BIN / "homelab-autoscaler")
REQUIRED = os.environ.get("HOMELAB_E2E_REAL", "") not in ("", "0")
PROMLINT = bin_dir() / "promlint"


def lint(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMLINT)], input=text, capture_output=True, text=True, timeout=60)


def served_metrics(tmp_path: Path) -> str:
    """/metrics of a `dev --simulate` run once a machine it booted runs (claims, activities, usage all counted)."""
    temporal, ui, kube, provider, health, metrics = (free_port() for _ in range(6))
    args = [CLI, "dev", "--simulate", "--time-scale", "0", "--temporal-port", str(temporal), "--ui-port", str(ui),
            "--kube-port", str(kube), "--provider-address", f"127.0.0.1:{provider}", "--health-port", str(health),
            "--metrics-address", f"127.0.0.1:{metrics}"]  # fmt: skip
    ca = [CLI, "autoscaler", "--provider-address", f"127.0.0.1:{provider}"]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    with (tmp_path / "dev.log").open("wb") as log:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: port_open(provider), timeout=90, what="the provider of `dev` to listen")

        def call(*more: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*ca, *more], capture_output=True, text=True, timeout=30)

        wait_for(lambda: call("node-groups").returncode == 0, timeout=60, what="NodeGroups to answer")
        assert call("increase", "workers", "1").returncode == 0
        wait_for(lambda: "running" in call("nodes", "workers").stdout, timeout=90, what="one machine running")
        return str(urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.long
@pytest.mark.timeout(420)
@pytest.mark.system
def test_prometheus_lint_finds_nothing_in_the_operators_metrics(tmp_path: Path) -> None:
    if not PROMLINT.is_file():
        why = f"promlint not built in {bin_dir()}: `make cluster-bins` builds it (Go >= 1.26)"
        if REQUIRED:
            pytest.fail(f"make e2e-real must lint the metrics: {why}")
        pytest.skip(why)
    text = served_metrics(tmp_path)
    for name in ("homelab_slot_energy_joules_total", "homelab_slot_always_on_energy_joules_total",
                 "homelab_slot_power_watts", "temporal_request_total", "homelab_provider_calls_total"):  # fmt: skip
        assert f"\n{name}{{" in text, f"{name} is not served: nothing to lint"
    done = lint(text)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr


def test_prometheus_lint_would_say_what_it_finds() -> None:
    """The check can fail: the lint flags a counter without `_total` and an hour as a unit (the old Wh gauges), with
    promtool's exit code for problems found (3)."""
    if not PROMLINT.is_file():
        pytest.skip(f"promlint not built in {bin_dir()}")
    bad = ("# HELP x_energy_used_watt_hours energy\n# TYPE x_energy_used_watt_hours gauge\n"
           "x_energy_used_watt_hours 1\n# HELP x_boots boots\n# TYPE x_boots counter\nx_boots 1\n")  # fmt: skip
    done = lint(bad)
    assert done.returncode == 3 and "hours" in done.stdout + done.stderr and "_total" in done.stdout + done.stderr
