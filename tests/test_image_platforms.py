"""Every image a user pulls from elsewhere is in docs/install.md's table of platforms, for amd64 and arm64 (issue
42): the ground node is often an arm64 board, so an image published for amd64 alone would strand the install there.
The images are read from the manifests and the chart's defaults, so a new one cannot slip in unlisted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.procs import ROOT

DOC = ROOT / "docs" / "install.md"
# Ours (built from this repository) and the kind test environment's, which no user installs.
OURS = ("homelab-autoscaler", "ghcr.io/homecluster/homelab-autoscaler", "registry.lan/homelab/power-")
NOT_INSTALLED = ("deploy/kind/",)


def _images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            elif key == "image" and isinstance(value, dict) and "repository" in value and "tag" in value:
                yield f"{value['repository']}:{value['tag']}"
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def named_images() -> dict[str, str]:
    """Image → the first file naming it, from deploy/ and the chart's values (bundled Temporal's images)."""
    found: dict[str, str] = {}
    files = [*sorted((ROOT / "deploy").rglob("*.yaml")), ROOT / "charts" / "homelab-autoscaler" / "values.yaml"]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(NOT_INSTALLED) or rel.startswith("deploy/crds/"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            for image in _images(doc):
                if not image.startswith(OURS) and image != "homelab-autoscaler":
                    found.setdefault(image, rel)
    return found


def platform_rows(text: str) -> dict[str, tuple[str, str]]:
    """The table's image cells (each backticked name) → its (linux/amd64, linux/arm64) cells."""
    rows: dict[str, tuple[str, str]] = {}
    table = text.split("The images a user pulls from elsewhere", 1)[1]
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("image", "---"):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = (cells[2], cells[3])
    return rows


def test_every_image_from_elsewhere_is_listed_for_both_platforms() -> None:
    rows = platform_rows(DOC.read_text())
    images = named_images()
    assert images, "no image read from deploy/ and the chart"
    missing = {image: where for image, where in images.items() if image not in rows}
    assert not missing, f"docs/install.md's platform table lacks: {missing}"
    single = {image: rows[image] for image in images if not all(cell.startswith("yes") for cell in rows[image])}
    assert not single, f"published for one platform only: {single}"


def test_the_table_reader_sees_what_a_row_says() -> None:
    text = ("The images a user pulls from elsewhere are\n\n| image | by | linux/amd64 | linux/arm64 |\n"
            "|---|---|---|---|\n| `a:1`, `b:2` | x | yes | no |\n")  # fmt: skip
    assert platform_rows(text) == {"a:1": ("yes", "no"), "b:2": ("yes", "no")}


def test_the_manifests_name_the_images_the_table_is_about() -> None:
    images = named_images()
    assert {"temporalio/server:1.32.1", "postgres:15.18-bookworm",
            "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2"} <= set(images)  # fmt: skip
    assert not any(Path(where).parts[:2] == ("deploy", "kind") for where in images.values())
