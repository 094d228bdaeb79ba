"""The chart's README is generated from values.yaml and values.schema.json (tools/chart_readme.py, `make docs`):
it is never stale, and it names every value the schema accepts."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = runpy.run_path(str(ROOT / "tools" / "chart_readme.py"))
CHART = ROOT / "charts" / "homelab-autoscaler"


def test_the_chart_readme_is_generated_from_the_values() -> None:
    assert (CHART / "README.md").read_text() == TOOL["render"](), "stale: run `make docs`"


def test_every_value_is_in_the_readme_with_its_words() -> None:
    readme = (CHART / "README.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = [p for p, section in TOOL["_leaves"](schema, schema.get("definitions", {})) if not section]
    assert len(leaves) > 20
    for path in leaves:
        if not path.startswith("global"):
            assert f"| `{path}` |" in readme, path
    assert "| `image.repository` | `ghcr.io/homecluster/homelab-autoscaler` | The operator's image" in readme


def test_the_comment_reader_follows_indentation(tmp_path: Path) -> None:
    text = "# top\na:\n  # b's words\n  b: 1\n  c:\n    # d's\n    d: x\ne: 2\n"
    assert TOOL["_comments"](text) == {"a": "top", "a.b": "b's words", "a.c.d": "d's"}
