"""The I2I prompt catalog: edit instructions by category, kept as a versioned YAML data file."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from acrb.errors import InputDataError
from acrb.prompts.datafile import (
    VersionedDataFile,
    check_entries,
    check_source_selectors,
    load_data_file,
)
from acrb.records import PromptRecord

_ATTRIBUTE = re.compile(r"^(neutral|[a-z]+:[a-z0-9-]+)$")


class CategoryInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""


class CatalogPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    category: str
    text: str = Field(min_length=3, max_length=400)
    attribute: str
    congruent_with: list[str] = Field(default_factory=list)
    portraits: int = Field(
        default=1, ge=1, le=8, description="source portraits the instruction shows the editor "
        "together; the plan pairs them by plan.pairing")

    @field_validator("attribute")
    @classmethod
    def _attribute(cls, value: str) -> str:
        if not _ATTRIBUTE.match(value):
            raise ValueError(f"attribute must be 'neutral' or 'dimension:value', got {value!r}")
        return value

    @field_validator("congruent_with")
    @classmethod
    def _selectors(cls, value: list[str]) -> list[str]:
        return check_source_selectors(value)


class Catalog(VersionedDataFile):
    categories: dict[str, CategoryInfo]
    prompts: list[CatalogPrompt]


def load_catalog(path: Path) -> Catalog:
    """Read and validate a catalog file; errors name the file and the bad entry."""
    catalog = load_data_file(path, Catalog, "prompt catalog", "prompts.catalog")
    check_entries("prompt catalog", path, (p.id for p in catalog.prompts),
                  (p.category for p in catalog.prompts), catalog.categories,
                  entry_word="prompts", group_word="categories",
                  fix="add entries under 'prompts:' or point prompts.catalog elsewhere")
    return catalog


def catalog_prompt_records(catalog: Catalog, categories: list[str] | None = None
                           ) -> list[PromptRecord]:
    """Prompt records for the catalog, keeping only ``categories`` when given."""
    if categories is not None:
        missing = sorted(set(categories) - set(catalog.categories))
        if missing:
            raise InputDataError(
                f"prompts.categories lists {missing}, which catalog {catalog.label} does not have",
                "use some of: " + ", ".join(catalog.categories),
            )
    rows = [
        PromptRecord(
            prompt_id=p.id,
            category=p.category,
            text=p.text,
            attribute=p.attribute,
            base_id=p.id,
            congruent_with=";".join(p.congruent_with),
            synthesis="catalog",
            catalog=catalog.label,
            portraits=p.portraits,
        )
        for p in catalog.prompts
        if categories is None or p.category in categories
    ]
    if not rows:
        raise InputDataError(f"no prompts left after keeping categories {categories}",
                             "check prompts.categories in params.yaml")
    return rows
