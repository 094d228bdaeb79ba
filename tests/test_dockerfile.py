"""The image cannot be built here (no docker engine), so its essentials are checked by reading the Dockerfile:
pinned bases, a non-root numeric user, the one entrypoint, and every package the image installs copied in."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _args() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)


def test_every_base_image_is_pinned() -> None:
    bases = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert bases
    for base in bases:
        image = re.sub(r"\$\{(\w+)\}", lambda m: _args()[m[1]], base)
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
        assert image.startswith("python:3.11"), "the project targets Python 3.11"


def test_the_final_stage_runs_as_a_numeric_non_root_user() -> None:
    final = instructions()
    last_from = max(i for i, (w, _) in enumerate(final) if w == "FROM")
    users = [rest for word, rest in final[last_from:] if word == "USER"]
    assert users, "the final stage sets no USER, so it runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric, non-zero uid lets runAsNonRoot verify it"
    from tests.test_deploy import DEPLOY

    assert f"runAsUser: {uid}" in (DEPLOY / "base" / "operator.yaml").read_text(), "the manifests run the same uid"


def test_the_entrypoint_is_the_console_script() -> None:
    entry = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry and entry[-1] == '["homelab-autoscaler"]', "exec form, so signals reach the operator"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "homelab-autoscaler" in scripts


def test_every_package_is_copied_into_the_build() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {rest.split()[0].rstrip("/") for word, rest in instructions() if word == "COPY" and "--from" not in rest}
    for pattern in packages:
        name = pattern.rstrip("*")
        assert name in copied, f"package {name} is not copied into the image"


def test_the_dockerignore_keeps_the_context_small() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "tests"} <= ignored


def test_the_dependencies_are_installed_before_any_source_is_copied() -> None:
    """A code change rebuilds the image from the package's own install on: the dependencies' layer is keyed by
    the dependency list alone (a stage that reads it from pyproject.toml), so it is reused."""
    steps = instructions()
    build = next(i for i, (w, rest) in enumerate(steps) if w == "FROM" and rest.endswith("AS build"))
    deps = next(i for i, (w, rest) in enumerate(steps) if i > build and w == "RUN" and "pip install -r" in rest)
    first_source = next(i for i, (w, rest) in enumerate(steps) if i > build and w == "COPY" and "--from" not in rest)
    assert deps < first_source, "the dependencies are installed after the sources are copied: every change reinstalls"
    reader = next(rest for w, rest in steps if w == "RUN" and "tomllib" in rest)
    assert '["dependencies"]' in reader
    assert any(w == "RUN" and "--no-deps" in rest for w, rest in steps[first_source:]), "the package itself, alone"
