"""kubectl's cache (`.kube/cache/`) is never committed, and the suite's kubectl runs leave none under $HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from homelab_sim.emulator import EmulatorServer

ROOT = Path(__file__).resolve().parent.parent


def test_no_kube_cache_is_committed() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    committed = [f for f in files.splitlines() if ".kube" in Path(f).parts]
    assert committed == [], f"kubectl cache files are committed: {committed[:3]}"
    assert ".kube/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (apt-get install kubernetes-client)"
)
def test_kubectl_in_the_suite_caches_outside_home(emulator: EmulatorServer, tmp_path: Path) -> None:
    """With HOME at a checkout, as in a CI job, `kubectl get` writes nothing there (conftest sets KUBECACHEDIR)."""
    home = tmp_path / "checkout"
    home.mkdir()
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(home)}
    done = subprocess.run(
        ["kubectl", "--server", emulator.url, "get", "jobs", "-A"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list(home.rglob("*")) == [], "kubectl wrote under HOME"
    cache = Path(os.environ["KUBECACHEDIR"])
    assert not cache.is_relative_to(ROOT)
    assert any(cache.rglob("servergroups.json")), "kubectl cached its discovery where conftest told it"
