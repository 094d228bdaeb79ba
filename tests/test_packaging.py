"""What running needs is declared where running installs it.

`make run` installs the operator and `homelab-sim` only (no test extra). A module either one imports at run time,
or reads data from (`importlib.resources.files("x")`), that only the test extra brings works in the suite and
fails on a newcomer's machine; this test finds it from the source instead of waiting for that machine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = [
    "api", "domain", "kube", "workflows", "activities", "watchers", "provider", "admission", "proto",
    "homelab_autoscaler",
]  # fmt: skip
OWN = {*OPERATOR, "homelab_sim"}
# Developer tools that run from a `make test` venv only (`make proto`), never at run time.
DEV_TOOLS = {"proto/generate.py"}


def imported_modules(package: Path) -> dict[str, str]:
    """Top-level modules a package imports anywhere (functions included) or reads resources of: {module: where}."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        if f"{path.parent.name}/{path.name}" in DEV_TOOLS:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("resources.files")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value)]
            for name in names:
                found.setdefault(name.split(".")[0], f"{path.name}:{getattr(node, 'lineno', 0)}")
    return found


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ @]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in requirements}


def undeclared(modules: dict[str, str], declared: set[str]) -> list[str]:
    """Third-party modules whose distribution is not in `declared` (nor a dependency of a declared one)."""
    providers = importlib.metadata.packages_distributions()
    reachable = set(declared)
    todo = list(declared)
    while todo:  # what the declared distributions bring with them is installed too
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for dist in requirement_names([r for r in requires if "extra ==" not in r]) - reachable:
            reachable.add(dist)
            todo.append(dist)
    missing = []
    for module, where in modules.items():
        if module in OWN or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not dists & reachable:
            missing.append(f"{module} ({where}; from {sorted(dists) or 'nothing installed'})")
    return missing


def test_the_operator_declares_what_it_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    modules: dict[str, str] = {}
    for package in OPERATOR:
        modules.update(imported_modules(ROOT / package))
    assert not undeclared(modules, requirement_names(project["dependencies"]))


def test_the_simulator_declares_what_it_imports() -> None:
    project = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    modules = imported_modules(ROOT / "sim" / "homelab_sim")
    # The simulator reads the operator's API package (its CRDs and models): installed beside it by the sim extra.
    declared = requirement_names(project["dependencies"]) | requirement_names(["homelab-autoscaler"])
    assert not undeclared(modules, declared)


def test_the_check_finds_a_module_only_the_tests_bring(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = 'def f():\n    import pytest\n    return importlib.resources.files("hypothesis")\n'
    (package / "m.py").write_text("import importlib.resources\n\n" + body)
    missing = undeclared(imported_modules(package), {"pyyaml"})
    assert [m.split(" ")[0] for m in missing] == ["pytest", "hypothesis"]


def test_the_shipped_default_homelab_is_the_documented_example() -> None:
    """`dev --simulate` without --homelab serves the file homelab_sim ships; the docs point at the example."""
    shipped = ROOT / "sim" / "homelab_sim" / "homelab.yaml"
    assert shipped.read_text() == (ROOT / "deploy" / "examples" / "homelab.yaml").read_text(), (
        "copy deploy/examples/homelab.yaml to sim/homelab_sim/homelab.yaml (or the other way round)"
    )
