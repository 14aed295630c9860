"""params.yaml, typed: one section per stage, unknown keys rejected with the valid ones named.

Every stage reads the whole file through :func:`load_params`, so a typo anywhere fails early with
a message that names the key, what was expected and what was found.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from acrb.demographics import AGES, GENDERS, RACES
from acrb.detect.pixels import PixelThresholds
from acrb.errors import ConfigError
from acrb.models.base import Editor, EditorConfig
from acrb.models.registry import check_model_key, editor_class
from acrb.storage import content_hash

DEFAULT_PARAMS = Path("params.yaml")
_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileParams(Section):
    name: str = Field(description="profile name; also the MLflow experiment (acrb/<name>)")
    simulation: bool = Field(description="true when the audited models are simulated")
    description: str = ""


class SourcesParams(Section):
    kind: Literal["synthetic", "folder"] = Field(
        description="synthetic: procedurally drawn placeholder portraits; folder: your images "
        "listed in a manifest.csv (columns file, race, gender, age)"
    )
    resolution: int = Field(ge=32, le=2048, description="output images are resolution² pixels")
    seed: int = 0
    per_cell: int = Field(default=1, ge=1, description="portraits per race x gender x age cell")
    races: list[str] = Field(default_factory=lambda: list(RACES))
    genders: list[str] = Field(default_factory=lambda: list(GENDERS))
    ages: list[str] = Field(default_factory=lambda: list(AGES))
    folder: str | None = Field(default=None, description="for kind=folder: the image folder")

    @field_validator("races", "genders", "ages")
    @classmethod
    def _known(cls, value: list[str], info: Any) -> list[str]:
        valid = {"races": RACES, "genders": GENDERS, "ages": AGES}[info.field_name]
        unknown = [v for v in value if v not in valid]
        if unknown:
            raise ValueError(f"unknown value(s) {unknown}; valid: {', '.join(valid)}")
        if not value:
            raise ValueError("must list at least one value")
        return value


class PromptsParams(Section):
    catalog: str = Field(description="path of the I2I prompt catalog (YAML)")
    categories: list[str] | None = Field(
        default=None, description="categories to keep (default: all in the catalog)"
    )


class PlanParams(Section):
    seeds: list[int] = Field(min_length=1, description="seeds per source x prompt x model")
    arms: list[str] = Field(default_factory=lambda: ["none"], min_length=1)


class GenerateParams(Section):
    batch_size: int = Field(default=16, ge=1, description="requests per model call")
    retry_errors: bool = Field(default=True, description="re-run requests that ended in error")
    verify_existing: bool = Field(
        default=True, description="check each finished image's sha256 before skipping it"
    )


class EvaluateParams(Section):
    thresholds: PixelThresholds = Field(default_factory=PixelThresholds)


class AnalyzeParams(Section):
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    alpha: float = Field(default=0.05, gt=0.0, lt=0.5, description="family-wise error rate")
    simultaneous_intervals: bool = Field(
        default=True,
        description="Δ intervals cover all the gaps of a table jointly at `confidence` "
        "(Bonferroni over the table) rather than each on its own",
    )


class ReportParams(Section):
    title: str = "ACRB audit report"


class ModelEntry(Section):
    key: str = Field(description="registry key, e.g. synthetic:biased")
    revision: str | None = Field(default=None, description="pinned weights revision")
    settings: dict[str, Any] = Field(default_factory=dict, description="generation settings")
    config: dict[str, Any] = Field(default_factory=dict, description="adapter config")

    @field_validator("key")
    @classmethod
    def _registered(cls, value: str) -> str:
        try:
            return check_model_key(value)
        except ConfigError as exc:
            raise ValueError(f"{exc.problem}; {exc.fix}") from exc

    def typed_config(self) -> EditorConfig:
        return editor_class(self.key).Config.model_validate(self.config)

    def resolved_revision(self) -> str:
        return editor_class(self.key).resolve_revision(self.key, self.typed_config(), self.revision)

    def build(self) -> Editor:
        """Instantiate the adapter (this may load weights: call it only when there is work)."""
        return editor_class(self.key)(self.key, self.typed_config(), self.revision)


class Params(Section):
    profile: ProfileParams
    sources: SourcesParams
    prompts: PromptsParams
    plan: PlanParams
    generate: GenerateParams = Field(default_factory=GenerateParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    analyze: AnalyzeParams = Field(default_factory=AnalyzeParams)
    report: ReportParams = Field(default_factory=ReportParams)
    models: dict[str, ModelEntry] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _slugs(cls, value: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        for name in value:
            if not _SLUG.match(name):
                raise ValueError(
                    f"model entry name '{name}' must be lowercase letters, digits, '.', '_' or "
                    "'-' (it names a folder and a DVC stage)"
                )
        return value

    def model(self, name: str) -> ModelEntry:
        if name not in self.models:
            raise ConfigError(
                f"no model entry '{name}' under 'models' in params.yaml",
                "use one of: " + ", ".join(self.models),
            )
        return self.models[name]


def _format_error(path: Path, errors: list[dict[str, Any]]) -> ConfigError:
    lines = []
    for error in errors[:10]:
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        found = error.get("input")
        shown = "" if isinstance(found, dict) else f" (found {found!r})"
        lines.append(f"  {where}: {error['msg']}{shown}")
    return ConfigError(
        f"{path} is invalid:\n" + "\n".join(lines),
        f"edit {path} (or pass -S key=value to `dvc exp run`) to fix the key(s) above",
    )


def load_params(path: Path = DEFAULT_PARAMS) -> tuple[Params, str]:
    """Read and validate params; returns the typed params and their content hash."""
    if not path.exists():
        raise ConfigError(f"{path} not found", "run from the project root, or pass --params")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}", "fix the YAML syntax") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping of sections", "see the README's params")
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        raise _format_error(path, list(exc.errors())) from exc
    errors: list[dict[str, Any]] = []
    for name, entry in params.models.items():
        try:
            entry.typed_config()
        except ValidationError as exc:
            errors += [{**e, "loc": ("models", name, "config", *e["loc"])} for e in exc.errors()]
    if errors:
        raise _format_error(path, errors)
    return params, content_hash(raw)
