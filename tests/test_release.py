"""Release mechanics a user sees: one version (pyproject.toml), and everything that names it says the same.

The simulated homelab's distribution, the `sim` extra's pin, the image tag the manifests install, `homelab-autoscaler
--version`, the CHANGELOG's newest section, and tests/releases.py (every release older than the version being
built) follow pyproject.toml; CI runs the upgrade from the previous release (`make upgrade`).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml
from packaging.version import Version

from tests import releases
from tests.procs import BIN

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "ghcr.io/homecluster/homelab-autoscaler"


def project(path: str) -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / path).read_text())["project"])


def test_the_simulated_homelab_is_released_with_the_operator() -> None:
    version = releases.current()
    assert project("sim/pyproject.toml")["version"] == version
    assert f"homelab-sim=={version}" in project("pyproject.toml")["optional-dependencies"]["sim"]


def image_entries() -> dict[str, dict[str, Any]]:
    """Every kustomization's `images:` entry that names the released image, by its directory."""
    found = {}
    for path in sorted((ROOT / "deploy").rglob("kustomization.yaml")):
        for entry in yaml.safe_load(path.read_text()).get("images") or []:
            if entry.get("newName") == IMAGE:
                found[str(path.parent.relative_to(ROOT))] = entry
    return found


def test_the_manifests_install_the_image_of_this_version() -> None:
    entries = image_entries()
    assert {"deploy/base", "deploy/overlays/homelab", "deploy/overlays/split"} <= set(entries)
    wrong = {where: e.get("newTag") for where, e in entries.items() if e.get("newTag") != releases.current()}
    assert not wrong, f"newTag must be pyproject.toml's version {releases.current()}: {wrong}"


def test_the_command_says_its_version() -> None:
    done = subprocess.run([str(BIN / "homelab-autoscaler"), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"homelab-autoscaler {releases.current()}"


def test_the_changelog_opens_with_this_release() -> None:
    heads = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert heads and heads[0] == str(releases.release_of(releases.current())), heads[:1]
    assert heads == sorted(heads, key=Version, reverse=True), "newest first"


def test_every_release_is_older_than_the_version_being_built() -> None:
    """Cutting a release moves pyproject.toml on: the release just made is then the previous one."""
    versions = [Version(r.version) for r in releases.RELEASES]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert all(v < releases.release_of(releases.current()) for v in versions)
    for r in releases.RELEASES:
        assert r.tag in ("", f"v{r.version}"), r
        assert re.fullmatch(r"[0-9a-f]{40}", r.commit), r


def test_ci_runs_the_upgrade_from_the_previous_release() -> None:
    assert re.search(r"^upgrade: .*## ", (ROOT / "Makefile").read_text(), re.M)
    assert re.search(r"^[^#\n]*\bmake upgrade$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert releases.previous() is not None, "the version being built has a previous release to upgrade from"
