from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from acrb.errors import InputDataError
from acrb.prompts.catalog import catalog_prompt_records, load_catalog
from tests.conftest import CATALOG


def test_shipped_catalog_has_ten_prompts_per_category() -> None:
    catalog = load_catalog(CATALOG)
    counts = Counter(p.category for p in catalog.prompts)
    assert counts == {"A": 10, "B": 10, "C": 10, "D": 10, "E": 10}
    assert all(p.attribute == "neutral" for p in catalog.prompts if p.category == "A")
    # Stereotype congruence is declared where SCS needs it (occupational, cultural).
    for category in ("B", "C"):
        linked = [p for p in catalog.prompts if p.category == category and p.congruent_with]
        assert len(linked) >= 5, category


def test_category_filter(tmp_path: Path) -> None:
    records = catalog_prompt_records(load_catalog(CATALOG), ["A", "C"])
    assert {r.category for r in records} == {"A", "C"}
    assert len(records) == 20
    with pytest.raises(InputDataError, match="'Z'"):
        catalog_prompt_records(load_catalog(CATALOG), ["Z"])


def test_empty_catalog_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("name: empty\nversion: 1\ncategories: {A: {name: neutral}}\nprompts: []\n")
    with pytest.raises(InputDataError, match="has no prompts") as err:
        load_catalog(path)
    assert str(path) in str(err.value)


def test_bad_entries_are_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\nversion: 1\ncategories: {A: {name: neutral}}\nprompts:\n"
        "  - {id: A01, category: A, text: Add a hat., attribute: neutral,"
        " congruent_with: ['race:Martian']}\n"
    )
    with pytest.raises(InputDataError, match=r"prompts\.0\.congruent_with"):
        load_catalog(path)
    path.write_text(
        "name: bad\nversion: 1\ncategories: {A: {name: neutral}}\nprompts:\n"
        "  - {id: A01, category: A, text: Add a hat., attribute: neutral}\n"
        "  - {id: A01, category: A, text: Add a scarf., attribute: neutral}\n"
    )
    with pytest.raises(InputDataError, match="duplicate ids"):
        load_catalog(path)


def test_missing_catalog(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="not found"):
        load_catalog(tmp_path / "nowhere.yaml")
