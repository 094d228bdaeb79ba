"""The layers hold by construction: the import contract passes, fails on a planted back-arrow, and the operator
runs where the simulated homelab is not installed (it is a separate distribution, never in the operator's wheel)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import urllib.request
from pathlib import Path

import pytest
from setuptools import find_packages

from tests.procs import BIN, ROOT, free_port, port_open, process, wait_for

PACKAGES = [
    "api", "domain", "kube", "workflows", "activities", "watchers", "provider", "admission", "proto",
    "homelab_autoscaler",
]  # fmt: skip


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "lint-imports"), str(root / ".importlinter"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{root}:{root / 'sim'}", "PATH": str(BIN)},
    )


def test_the_import_contract_is_kept() -> None:
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


BACK_ARROWS = [
    ("domain/law.py", "import workflows.verbs"),  # a rule reaching up into Temporal code
    ("domain/claims.py", "import temporalio.workflow"),  # the rules knowing Temporal
    ("watchers/dispatch.py", "import activities.kube_activities"),  # a role importing the Temporal code
    ("provider/service.py", "import homelab_autoscaler.roles"),  # a role importing the composition root
    ("admission/server.py", "import provider.service"),  # a role importing another role
    ("workflows/verbs.py", "import kube.adapter"),  # workflow code reaching the cluster
    ("homelab_autoscaler/roles.py", "import homelab_sim.homelab"),  # the product importing the simulator
    ("kube/views.py", "import watchers.report"),  # the cluster layer importing a role
]


@pytest.mark.parametrize(("where", "arrow"), BACK_ARROWS, ids=[w for w, _ in BACK_ARROWS])
def test_a_back_arrow_breaks_the_contract(where: str, arrow: str, tmp_path: Path) -> None:
    copy = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=ignore)
    shutil.copytree(ROOT / "sim" / "homelab_sim", copy / "sim" / "homelab_sim", ignore=ignore)
    shutil.copy(ROOT / ".importlinter", copy / ".importlinter")
    target = copy / where
    target.write_text(target.read_text() + f"\n{arrow}  # planted\n")
    res = lint_imports(copy)
    assert res.returncode != 0 and "BROKEN" in res.stdout, f"{arrow} in {where} was not caught:\n{res.stdout[-2000:]}"


def test_the_operator_wheel_has_no_simulator() -> None:
    """The packages setuptools puts in the operator's wheel, found with the project's own configuration."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {"api", "domain", "homelab_autoscaler", "workflows"} <= set(packages)
    assert not [p for p in packages if p.startswith(("homelab_sim", "sim", "tests"))], packages
    assert "homelab-sim" in " ".join(config["project"]["optional-dependencies"]["sim"])


@pytest.mark.system
async def test_run_works_without_the_simulator(tmp_path: Path) -> None:
    """`homelab-autoscaler run` with homelab_sim made unimportable: every role comes up and reports ready."""
    from temporalio.testing import WorkflowEnvironment

    from homelab_autoscaler.temporal import DATA_CONVERTER, register_search_attributes

    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # Imported at interpreter start: a finder that refuses homelab_sim, as an install without the extra would.
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoSimulator:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'homelab_sim' or name.startswith('homelab_sim.'):\n"
        "            raise ModuleNotFoundError('homelab_sim is not installed', name=name)\n"
        "sys.meta_path.insert(0, _NoSimulator())\n"
    )
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"), data_converter=DATA_CONVERTER
    )
    try:
        await register_search_attributes(env.client, "default")
        kube_port, health_port = free_port(), free_port()
        address = env.client.service_client.config.target_host
        sim = [str(BIN / "python"), "-m", "homelab_sim", "--port", str(kube_port), "--time-scale", "0"]
        metrics, provider = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        run = [str(BIN / "homelab-autoscaler"), "run", "--temporal-address", address,
               "--kube-server", f"http://127.0.0.1:{kube_port}", "--health-port", str(health_port),
               "--metrics-address", metrics, "--provider-address", provider]  # fmt: skip
        with (
            process(sim, log=tmp_path / "sim.log"),
            process(run, log=tmp_path / "run.log", env={"PYTHONPATH": str(blocker)}) as proc,
        ):
            wait_for(lambda: port_open(kube_port), timeout=30, what="the simulated homelab's API server")

            def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
                try:
                    return bool(
                        urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2).status == 200
                    )
                except OSError:
                    return False

            wait_for(ready, timeout=60, what="/readyz of `run` without homelab_sim")
        log = (tmp_path / "run.log").read_text()
        assert "homelab_sim" not in log, log[-3000:]
        probe = subprocess.run(
            [str(BIN / "python"), "-c", "import homelab_sim"],
            env={"PYTHONPATH": str(blocker)}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert probe.returncode != 0, "the blocker did not hide homelab_sim: the test proves nothing"
    finally:
        await env.shutdown()
