"""The image's virtualenv slimming (tools/slim_venv.py, issue 42): what it packs, what it removes, and that what it
packs still imports, with its sources for tracebacks and its bytecode so nothing compiles at start."""

from __future__ import annotations

import ast
import runpy
import subprocess
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.procs import ROOT

TOOL: dict[str, Any] = runpy.run_path(str(ROOT / "tools" / "slim_venv.py"))
PROJECT = ("api", "domain", "kube", "workflows", "activities", "watchers", "provider", "admission", "proto",
           "homelab_autoscaler")  # fmt: skip


def _write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_only_pure_python_that_reads_nothing_beside_it_is_packed(tmp_path: Path) -> None:
    packable = TOOL["packable"]
    _write(tmp_path / "pure" / "__init__.py", "X = 1\n")
    _write(tmp_path / "pure" / "sub" / "__init__.py")
    _write(tmp_path / "native" / "__init__.py")
    _write(tmp_path / "native" / "_speed.cpython-311-x86_64-linux-gnu.so", "ELF")
    _write(tmp_path / "reads" / "__init__.py", "import os\nHERE = os.path.dirname(__file__)\n")
    _write(tmp_path / "namespace" / "part.py")  # no __init__: its other parts may be elsewhere
    # certifi's way to its bundle: from a zip, as_file writes it to a temporary file, which a Pod cannot.
    _write(tmp_path / "bundle" / "__init__.py", "from importlib.resources import as_file, files\n"
           "def where():\n    return as_file(files('bundle') / 'cacert.pem')\n")  # fmt: skip
    _write(tmp_path / "pure-1.0.dist-info" / "METADATA")
    _write(tmp_path / "single.py", "Y = 2\n")
    assert packable(tmp_path / "pure") and packable(tmp_path / "single.py")
    for name in ("native", "reads", "namespace", "bundle", "pure-1.0.dist-info"):
        assert not packable(tmp_path / name), name


def test_what_no_pod_runs_is_removed_and_said(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    _write(site / "pip" / "__init__.py")
    _write(site / "pip-23.0.dist-info" / "RECORD")
    _write(site / "kubernetes" / "aio" / "client.py", "x" * 100)
    _write(site / "kubernetes" / "client" / "api.py")
    _write(site / "kubernetes" / "config" / "kube_config_test.py")
    _write(site / "grpc" / "__init__.pyi")
    _write(site / "kubernetes-37.dist-info" / "tests" / "odd")  # a dist-info is never touched
    _write(tmp_path / "venv" / "bin" / "pip")
    gone = dict(TOOL["remove"](site, TOOL["UNUSED"], TOOL["UNUSED_INSIDE"]))
    assert gone["kubernetes/aio"] == 100
    assert {"pip", "pip-23.0.dist-info", "kubernetes/config/kube_config_test.py", "grpc/__init__.pyi"} <= set(gone)
    assert (site / "kubernetes" / "client" / "api.py").exists()
    assert (site / "kubernetes-37.dist-info" / "tests" / "odd").exists()
    assert not (tmp_path / "venv" / "bin" / "pip").exists()


def test_a_packed_package_imports_from_the_zip_with_bytecode_and_source_lines(tmp_path: Path) -> None:
    """A real virtualenv: the package packed, found through the .pth line, its bytecode used as is (unchecked hash),
    and a traceback from it shows the line of source."""
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    site = TOOL["site_packages"](env)
    _write(site / "lab" / "__init__.py", "from lab.inner import fail\n")
    _write(site / "lab" / "inner.py", "def fail():\n    raise ValueError('from the zip')  # the line\n")
    size = TOOL["pack"](site, ["lab"])
    assert size > 0 and not (site / "lab").exists()
    names = set(zipfile.ZipFile(site / TOOL["ZIP_NAME"]).namelist())
    assert {"lab/__init__.py", "lab/__init__.pyc", "lab/inner.py", "lab/inner.pyc"} <= names
    script = "import lab, traceback\ntry:\n    lab.fail()\nexcept ValueError:\n    traceback.print_exc()\n" \
             "print(lab.__file__)"  # fmt: skip
    done = subprocess.run([str(env / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "site-packages.zip/lab/__init__.pyc" in done.stdout
    assert "raise ValueError('from the zip')  # the line" in done.stderr


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_product_imports_nothing_the_image_leaves_out() -> None:
    """What slim_venv removes is never imported by the product (import-linter checks pip and setuptools; it cannot
    name kubernetes.aio, a part of an external package)."""
    removed = ("kubernetes.aio", "pip", "setuptools", "pkg_resources")
    found = {
        f"{path.relative_to(ROOT)}: {name}"
        for package in PROJECT
        for path in (ROOT / package).rglob("*.py")
        for name in _imports(path)
        if any(name == r or name.startswith(r + ".") for r in removed)
    }
    assert not found


@pytest.mark.parametrize(("module", "packed"), [("kubernetes", True), ("pydantic", True), ("yaml", False),
                                               ("certifi", False)])  # fmt: skip
def test_the_packing_rule_on_the_real_dependencies(module: str, packed: bool) -> None:
    """The rule against this machine's installed dependencies: the Kubernetes client (the bulk of what is packed)
    and pydantic (its `__file__` only names its path) are packable; PyYAML, with its extension module, is not, nor
    certifi, whose CA bundle must be a file (met on the real node: packed, it failed every import of requests in a
    Pod, wanting a temporary file on a read-only root)."""
    spec_dir = Path(__import__(module).__file__ or "").parent
    assert TOOL["packable"](spec_dir) is packed


def test_generated_modules_keep_only_their_bytecode_and_still_import(tmp_path: Path) -> None:
    """A dependency's generated protobuf module left as a file: its bytecode beside where the source was, loaded
    without it; the project's own (`keep`) untouched."""
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    site = TOOL["site_packages"](env)
    _write(site / "dep" / "__init__.py")
    _write(site / "dep" / "thing_pb2.py", "DESCRIPTOR = b'x' * 10\n")
    _write(site / "dep" / "__pycache__" / "thing_pb2.cpython-311.pyc", "stale")
    _write(site / "ours" / "__init__.py")
    _write(site / "ours" / "mine_pb2.py", "MINE = 1\n")
    TOOL["bytecode_only"](site, keep=["ours"])
    assert not (site / "dep" / "thing_pb2.py").exists() and (site / "dep" / "thing_pb2.pyc").exists()
    assert not list((site / "dep" / "__pycache__").glob("thing_pb2.*"))
    assert (site / "ours" / "mine_pb2.py").exists()
    done = subprocess.run([str(env / "bin" / "python"), "-c", "import dep.thing_pb2 as t; print(len(t.DESCRIPTOR))"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "10", done.stderr


def test_a_dependencys_unused_integrations_go_and_the_used_one_stays(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name in ("__init__.py", "pydantic.py", "openai_agents/__init__.py", "aws/s3.py"):
        _write(site / "temporalio" / "contrib" / name)
    gone = dict(TOOL["remove"](site, (), ()))
    assert set(gone) == {"temporalio/contrib/openai_agents", "temporalio/contrib/aws"}
    assert (site / "temporalio" / "contrib" / "pydantic.py").exists()


def test_a_venv_for_another_platform_is_slimmed_without_importing_and_imported_by_the_last_stage(
    tmp_path: Path,
) -> None:
    """The cross-built image's two steps (Dockerfile): `--slim-only` on the builder imports nothing (a foreign
    extension module could not load there), strips with the program named; `--import-only` on the target's platform
    imports every module and fails the build, saying which, when one cannot."""
    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    site = TOOL["site_packages"](env)
    _write(site / "mine" / "__init__.py", "import nowhere_to_be_found\n")
    _write(site / "kubernetes" / "__init__.py")  # the check holds the real one to be packed: this one is
    _write(site / "native" / "ext.so", "not an ELF file: a strip that ran would fail on it")
    stripper = _write(tmp_path / "strip-for-target", '#!/bin/sh\necho "$@" > "$(dirname "$0")/stripped"\n')
    stripper.chmod(0o755)
    assert TOOL["main"]([str(env), "--strip", "--strip-program", str(stripper), "--slim-only", "--check", "mine"]) == 0
    assert "--strip-unneeded" in (tmp_path / "stripped").read_text()
    assert str(site / "native" / "ext.so") in (tmp_path / "stripped").read_text()
    with pytest.raises(SystemExit, match=r"(?s)cannot import the project:.*nowhere_to_be_found"):
        TOOL["main"]([str(env), "--import-only", "--check", "mine"])
    _write(site / "mine" / "__init__.py", "VALUE = 1\n")
    assert TOOL["main"]([str(env), "--import-only", "--check", "mine"]) == 0
