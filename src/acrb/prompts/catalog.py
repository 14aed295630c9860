"""The I2I prompt catalog: edit instructions by category, kept as a versioned YAML data file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
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

    @field_validator("attribute")
    @classmethod
    def _attribute(cls, value: str) -> str:
        if not _ATTRIBUTE.match(value):
            raise ValueError(f"attribute must be 'neutral' or 'dimension:value', got {value!r}")
        return value

    @field_validator("congruent_with")
    @classmethod
    def _selectors(cls, value: list[str]) -> list[str]:
        for selector in value:
            dimension, _, group = selector.partition(":")
            if group not in SOURCE_DIMENSIONS.get(dimension, ()):
                raise ValueError(
                    f"congruent_with selector {selector!r} must be one of "
                    + ", ".join(f"{d}:<{'|'.join(v)}>" for d, v in SOURCE_DIMENSIONS.items())
                )
        return value


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    version: int
    categories: dict[str, CategoryInfo]
    prompts: list[CatalogPrompt]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def load_catalog(path: Path) -> Catalog:
    """Read and validate a catalog file; errors name the file and the bad entry."""
    if not path.exists():
        raise InputDataError(f"prompt catalog {path} not found",
                             "set prompts.catalog in params.yaml to an existing YAML file")
    try:
        raw = yaml.safe_load(path.read_text())
        catalog = Catalog.model_validate(raw)
    except yaml.YAMLError as exc:
        raise InputDataError(f"prompt catalog {path} is not valid YAML: {exc}",
                             "fix the YAML syntax") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputDataError(f"prompt catalog {path}: {where}: {first['msg']}",
                             "fix that entry (see the catalog's header for the format)") from exc
    if not catalog.prompts:
        raise InputDataError(f"prompt catalog {path} has no prompts",
                             "add entries under 'prompts:' or point prompts.catalog elsewhere")
    ids = [p.id for p in catalog.prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise InputDataError(f"prompt catalog {path}: duplicate ids {duplicates}",
                             "give every prompt a unique id")
    unknown = sorted({p.category for p in catalog.prompts} - set(catalog.categories))
    if unknown:
        raise InputDataError(f"prompt catalog {path}: prompts use undeclared categories {unknown}",
                             "declare them under 'categories:'")
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
        )
        for p in catalog.prompts
        if categories is None or p.category in categories
    ]
    if not rows:
        raise InputDataError(f"no prompts left after keeping categories {categories}",
                             "check prompts.categories in params.yaml")
    return rows
