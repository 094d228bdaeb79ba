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


def _stages() -> list[tuple[str, str, str]]:
    """(platform flag, image, stage name) of each FROM."""
    out = []
    for word, rest in instructions():
        if word == "FROM":
            flags = [w for w in rest.split() if w.startswith("--")]
            image, *alias = [w for w in rest.split() if not w.startswith("--")]
            platform = next((f.split("=", 1)[1] for f in flags if f.startswith("--platform=")), "")
            out.append((platform, image, alias[-1] if alias else ""))
    return out


def test_every_base_image_is_pinned() -> None:
    bases = [image for _, image, _ in _stages()]
    assert bases
    for base in bases:
        image = base
        while "${" in image:  # an ARG's default may name another ARG
            image = re.sub(r"\$\{(\w+)\}", lambda m: _args()[m[1]], image)
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
    deps = next(i for i, (w, rest) in enumerate(steps) if i > build and w == "RUN" and "pip install" in rest
                and " -r " in rest)  # fmt: skip
    first_source = next(i for i, (w, rest) in enumerate(steps) if i > build and w == "COPY" and "--from" not in rest)
    assert deps < first_source, "the dependencies are installed after the sources are copied: every change reinstalls"
    reader = next(rest for w, rest in steps if w == "RUN" and "tomllib" in rest)
    assert '["dependencies"]' in reader
    assert any(w == "RUN" and "--no-deps" in rest for w, rest in steps[first_source:]), "the package itself, alone"


def test_the_build_stages_run_on_the_builders_platform_and_only_the_last_on_the_targets() -> None:
    """An arm64 image built on amd64 runs nothing under emulation but its last stage's check (issue 42: the build
    under qemu was 4 to 5 minutes of a cold CI run): the build stages are the builder's platform, the wheels the
    target's, binutils the target's; the last stage, the target's platform, imports every module it ships."""
    stages = _stages()
    *builds, final = stages
    assert builds and all(platform == "$BUILDPLATFORM" for platform, _, _ in builds), builds
    assert final[0] == "$TARGETPLATFORM", final
    steps = instructions()
    (install,) = [rest for w, rest in steps if w == "RUN" and "pip install" in rest and " -r " in rest]
    assert "--only-binary=:all:" in install and "--platform" in install and "--target" in install
    (slim,) = [rest for w, rest in steps if w == "RUN" and "slim_venv.py" in rest and "--strip" in rest]
    assert "--slim-only" in slim and "--strip-program" in slim, "the target's strip, no import on the builder"
    last = max(i for i, (w, _) in enumerate(steps) if w == "FROM")
    (check,) = [rest for w, rest in steps[last:] if w == "RUN" and "--import-only" in rest]
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        assert pattern.rstrip("*") in check.split("--check", 1)[1].split(), f"{pattern} is not imported by the check"
