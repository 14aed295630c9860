"""The I2I prompt catalog: edit instructions by category, kept as a versioned YAML data file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    field_validator,
    model_validator,
)

from acrb.errors import ConfigError, InputDataError
from acrb.prompts.datafile import (
    VersionedDataFile,
    check_entries,
    check_not_blank,
    check_source_selectors,
    congruence_link_problem,
    load_data_file,
)
from acrb.records import PromptRecord

_ATTRIBUTE = re.compile(r"^(neutral|[a-z]+:[a-z0-9-]+)$")

#: Keys an imported file carries that ACRB does not use, with their values as published (any
#: JSON value). Kept so that the catalog holds everything the file said; nothing reads them.
Metadata = dict[str, JsonValue]


def _metadata_field(what: str) -> Any:
    return Field(default_factory=dict, description=f"the imported file's other keys of {what}, "
                 "kept as published")


class CategoryInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    expected_refusal: str = Field(default="", description="the refusal an imported study "
                                  "expected of the category, in its words (e.g. a range)")
    expected_disparity: str = Field(default="", description="the disparity an imported study "
                                    "expected of the category, in its words")
    count: int | None = Field(default=None, ge=0, description="how many prompts an imported "
                              "file declares for the category (checked on import)")
    metadata: Metadata = _metadata_field("the category")


class CatalogPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    category: str
    text: str = Field(min_length=3, max_length=400)
    attribute: str
    congruent_with: list[str] = Field(
        default_factory=list, description="source groups a common stereotype links with the "
        "attribute (SCS's congruent side)")
    incongruent_with: list[str] = Field(
        default_factory=list, description="source groups the stereotype sets against the "
        "attribute (SCS's incongruent side); required when congruent_with is set")
    hypothesis: str = Field(default="", description="the hypothesis the prompt tests, as an "
                            "imported study names it")
    portraits: int = Field(
        default=1, ge=1, le=8, description="source portraits the instruction shows the editor "
        "together; the plan pairs them by plan.pairing")
    subcategory: str = Field(default="", description="the subcategory an imported study "
                             "gives the prompt (its category C: food/drink, religion/culture ...)")
    overt_domain: str = Field(default="", description="the overt harm domain an imported study "
                              "gives the prompt (its category E: violence, illegal activities ...)")
    metadata: Metadata = _metadata_field("the prompt entry")

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        check_not_blank(value)
        return value

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

    @field_validator("incongruent_with")
    @classmethod
    def _incongruent_selectors(cls, value: list[str]) -> list[str]:
        return check_source_selectors(value, "incongruent_with")

    @model_validator(mode="after")
    def _links(self) -> CatalogPrompt:
        problem = congruence_link_problem(self.congruent_with, self.incongruent_with)
        if problem:
            raise ValueError(problem)
        return self


class CatalogSource(BaseModel):
    """Where an imported catalog came from: the published file, as the user's copy had it."""

    model_config = ConfigDict(extra="forbid")
    file: str = Field(description="the imported file's name")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    version: str = Field(description="the version the file declares")
    links_file: str = Field(default="", description="the congruence links file, if one was given")
    links_sha256: str = ""
    description: str = Field(default="", description="the file's own description")
    total_prompts: int | None = Field(default=None, ge=0, description="the prompt count the "
                                      "file declares (checked on import)")
    experiment_scale: Metadata = Field(default_factory=dict, description="the file's "
                                       "`experiment_scale` object (counts of its run), as "
                                       "published")
    metadata: Metadata = _metadata_field("the file's top level")


class Catalog(VersionedDataFile):
    categories: dict[str, CategoryInfo]
    prompts: list[CatalogPrompt]
    source: CatalogSource | None = Field(
        default=None, description="provenance of an imported catalog (acrb prompts import-study)")

    @property
    def label(self) -> str:
        """``name@version``; for an imported catalog the imported file's version and sha256,
        which every prompt record then carries."""
        if self.source is None:
            return super().label
        return f"{self.name}@{self.source.version} sha256:{self.source.sha256}"


def load_catalog(path: Path) -> Catalog:
    """Read and validate a catalog file; errors name the file and the bad entry."""
    catalog = load_data_file(path, Catalog, "prompt catalog", "prompts.catalog")
    check_entries("prompt catalog", path, (p.id for p in catalog.prompts),
                  (p.category for p in catalog.prompts), catalog.categories,
                  entry_word="prompts", group_word="categories",
                  fix="add entries under 'prompts:' or point prompts.catalog elsewhere")
    return catalog


def catalog_prompt_records(catalog: Catalog, categories: list[str] | None = None,
                           ids: list[str] | None = None) -> list[PromptRecord]:
    """Prompt records for the catalog, keeping only ``categories`` and then only the prompt
    ``ids`` when given (``prompts.ids``; an id the catalog lacks is an error)."""
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
            incongruent_with=";".join(p.incongruent_with),
            hypothesis=p.hypothesis,
            subcategory=p.subcategory,
            overt_domain=p.overt_domain,
            experiment="audit",
            synthesis="catalog",
            catalog=catalog.label,
            portraits=p.portraits,
        )
        for p in catalog.prompts
        if categories is None or p.category in categories
    ]
    if ids is not None:
        rows = _keep_ids(rows, ids, catalog, categories)
    if not rows:
        raise InputDataError(f"no prompts left after keeping categories {categories}",
                             "check prompts.categories in params.yaml")
    return rows


def _keep_ids(rows: list[PromptRecord], ids: list[str], catalog: Catalog,
              categories: list[str] | None) -> list[PromptRecord]:
    """The rows whose id is in ``ids``, in catalog order; every id asked for must be there."""
    in_catalog = {p.id for p in catalog.prompts}
    absent = [i for i in dict.fromkeys(ids) if i not in in_catalog]
    if absent:
        raise ConfigError(
            f"prompts.ids asks for {absent}, which catalog {catalog.label} does not have",
            "check the ids against the catalog (prompts.catalog), or import the study's prompt "
            "file again (acrb prompts import-study)")
    kept = {r.prompt_id for r in rows}
    dropped = [i for i in dict.fromkeys(ids) if i not in kept]
    if dropped:
        raise ConfigError(
            f"prompts.ids asks for {dropped}, whose categories prompts.categories "
            f"({categories}) leaves out",
            "add their categories to prompts.categories, or set prompts.categories to null")
    wanted = set(ids)
    return [r for r in rows if r.prompt_id in wanted]
