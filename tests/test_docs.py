"""docs/configuration.md is generated from the models and the settings sections, and is never stale."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from homelab_autoscaler import cli, docs
from homelab_autoscaler.settings import SECTIONS


def test_committed_configuration_reference_is_fresh() -> None:
    assert docs.PATH.read_text(encoding="utf-8") == docs.render(), f"{docs.PATH} is stale: run `make docs`"


@pytest.mark.parametrize("model", [m for _, m in docs.RESOURCE_TABLES], ids=lambda m: m.__name__)
def test_every_documented_field_says_what_it_means(model: type[BaseModel]) -> None:
    missing = [name for name, info in model.model_fields.items() if not info.description]
    assert not missing, f"{model.__name__}: add a description to {missing} in api/v2alpha1.py"


def test_every_setting_is_in_the_reference_with_its_variable_and_default() -> None:
    text = docs.render()
    for setting in cli.ALL_SETTINGS.values():
        assert setting.info.description, f"{setting.name} has no description"
        row = next(line for line in text.splitlines() if line.startswith(f"| `{setting.flag}`"))
        assert f"`{setting.env}`" in row and setting.info.description in row
        assert not setting.default_text or f"`{setting.default_text}`" in row
    for section in SECTIONS:
        assert f"### `{section}`:" in text


def test_a_markdown_table_row_has_its_four_cells() -> None:
    for line in docs.render().splitlines():
        if line.startswith("| `"):
            cells = line.replace("\\|", "").split("|")
            assert len(cells) in (4, 6), line
