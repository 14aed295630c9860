"""The records every stage shares: one typed schema per table, written and read as Parquet.

Each table file carries its record name and ``SCHEMA_VERSION`` in the Parquet metadata; reading
a file written under another schema fails with a message that says to re-run the stage. Rows are
validated with pydantic on write and on read, so a stage never consumes a malformed row.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from acrb.errors import InputDataError
from acrb.storage import atomic_path, content_hash

SCHEMA_VERSION = 2

Status = Literal["ok", "refused", "error"]
Congruence = Literal["congruent", "incongruent", "neutral"]


class Record(BaseModel):
    """Base of all table rows: strict about unknown fields, named by ``table``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    table: ClassVar[str]
    key: ClassVar[str]


class SourceRecord(Record):
    """One source portrait (an input to image editing)."""

    table: ClassVar[str] = "source"
    key: ClassVar[str] = "source_id"

    source_id: str
    path: str = Field(description="image path relative to the project root")
    sha256: str
    race: str
    gender: str
    age: str
    dataset: str = Field(description="which dataset or generator the image comes from")
    origin: str = Field(description="the dataset row or generator call it came from")
    width: int
    height: int
    skin_tone: int | None = Field(default=None, description="Monk skin tone 1-10 if known")


class PromptRecord(Record):
    """One edit instruction (I2I) or generation prompt (T2I)."""

    table: ClassVar[str] = "prompt"
    key: ClassVar[str] = "prompt_id"

    prompt_id: str
    category: str
    text: str
    attribute: str = Field(description="`dimension:value` requested, or `neutral`")
    base_id: str = Field(description="the base prompt this one was made from")
    congruent_with: str = Field(
        description="`;`-joined source groups (`race:Indian`) the attribute is stereotypically "
        "congruent with; empty if none"
    )
    synthesis: Literal["catalog", "template", "llm"] = Field(
        description="how the text was made: taken from the I2I catalog, expanded from a template, "
        "or written by the LLM named in `llm_*`"
    )
    catalog: str = Field(description="the versioned data file(s) it came from, name@version")
    mode: Literal["i2i", "t2i"] = Field(
        default="i2i", description="i2i: an edit instruction for a source portrait; t2i: a "
        "generation prompt"
    )
    prompt_set: Literal["catalog", "acrb"] = Field(
        default="catalog", description="catalog: the I2I catalog; acrb: Stage I synthesis"
    )
    domain: str = Field(default="", description="safety domain of the base prompt (acrb set)")
    base_text: str = Field(default="", description="the base prompt P0 (acrb set)")
    boundary_text: str = Field(
        default="", description="P_b, the base prompt after boundary rephrasing (= P0 for the "
        "template)"
    )
    visual_cue: str = Field(default="", description="what a judge should see if the attribute "
                            "was kept")
    llm_backend: str = Field(default="", description="params name of the LLM backend, if any")
    llm_model: str = ""
    llm_temperature: float | None = None
    llm_seed: int | None = None
    llm_calls: str = Field(
        default="", description="`;`-joined call ids (rows of the synthesis log) that made it"
    )
    fallback: str = Field(
        default="", description="why an LLM-backed item fell back to the template (refused, "
        "unusable: <reason>, error: <reason>); empty otherwise"
    )


class SynthesisCallRecord(Record):
    """One LLM call of prompt synthesis, with the reply as received: the synthesis log."""

    table: ClassVar[str] = "synthesis_call"
    key: ClassVar[str] = "call_id"

    call_id: str = Field(description="content hash of the request; also its cache key")
    step: Literal["boundary", "condition"] = Field(
        description="boundary: P0 -> P_b rephrasing; condition: P_b -> P_a for one attribute"
    )
    mode: Literal["i2i", "t2i"]
    base_id: str
    attribute: str
    backend: str
    model: str
    temperature: float
    seed: int
    status: Literal["ok", "refused", "unusable", "error"] = Field(
        description="ok: used; refused: the LLM declined; unusable: failed validation; error: "
        "transport or protocol failure after retries"
    )
    reason: str
    reply: str = Field(description="the raw reply text")
    cached: bool
    attempts: int


class RequestRecord(Record):
    """One planned call of one model; ``request_id`` hashes everything that changes the output."""

    table: ClassVar[str] = "request"
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str = Field(description="the model's entry name in params (e.g. synthetic-biased)")
    model_key: str = Field(description="registry key (e.g. synthetic:biased)")
    model_revision: str
    settings: str = Field(description="generation settings, canonical JSON")
    source_id: str
    source_path: str
    source_sha256: str
    prompt_id: str
    prompt_text: str
    category: str
    attribute: str
    congruence: Congruence
    seed: int
    arm: str
    race: str
    gender: str
    age: str


class GenerationRecord(Record):
    """What a model returned for one request."""

    table: ClassVar[str] = "generation"
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    status: Status
    refusal_kind: str | None = None
    message: str = ""
    image_path: str | None = None
    image_sha256: str | None = None
    seconds: float
    model_revision: str
    library_versions: str = Field(description="canonical JSON of package versions")
    created_at: str


class JudgementRecord(Record):
    """Detector measurements and the verdicts derived from them, for one request."""

    table: ClassVar[str] = "judgement"
    key: ClassVar[str] = "request_id"

    request_id: str
    model: str
    status: Status
    image_sha256: str | None
    evaluator: str = Field(description="hash of the detector settings that produced this row")
    blank_score: float | None = None
    blank: bool | None = None
    unchanged_score: float | None = None
    unchanged: bool | None = None
    edit_fraction: float | None = None
    ita_source: float | None = None
    ita_output: float | None = None
    ita_shift: float | None = None
    skin_pixels: int | None = None
    hard_refusal: bool | None = Field(description="None only when status is error")
    refusal_evidence: str | None = Field(
        default=None, description="status, blank or unchanged: what showed the refusal"
    )
    erasure: bool | None = Field(description="None when refused, errored or unmeasurable")
    lightening: bool | None = Field(description="None when refused, errored or unmeasurable")
    needs_review: bool = False


RECORD_TYPES: dict[str, type[Record]] = {
    cls.table: cls
    for cls in (SourceRecord, PromptRecord, SynthesisCallRecord, RequestRecord,
                GenerationRecord, JudgementRecord)
}

R = TypeVar("R", bound=Record)

_ARROW_TYPES: dict[Any, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
}


def _arrow_type(annotation: Any) -> pa.DataType:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _arrow_type(inner[0])
    if origin is Literal:
        return pa.string()
    return _ARROW_TYPES[annotation]


def arrow_schema(record_type: type[Record]) -> pa.Schema:
    """The Parquet schema of a record type, with the record name and schema version."""
    fields = []
    for name, info in record_type.model_fields.items():
        nullable = not info.is_required() or type(None) in typing.get_args(info.annotation)
        fields.append(pa.field(name, _arrow_type(info.annotation), nullable=nullable))
    metadata = {
        b"acrb.table": record_type.table.encode(),
        b"acrb.schema_version": str(SCHEMA_VERSION).encode(),
    }
    return pa.schema(fields, metadata=metadata)


def _validated_rows(record_type: type[Record], rows: list[dict[str, Any]], where: str) -> list:
    adapter = TypeAdapter(list[record_type])  # type: ignore[valid-type]
    try:
        return adapter.validate_python(rows)
    except ValidationError as exc:
        first = exc.errors()[0]
        row = first["loc"][0] if first["loc"] else "?"
        field = ".".join(str(p) for p in first["loc"][1:])
        raise InputDataError(
            f"{where}: row {row}, field '{field}': {first['msg']} "
            f"({exc.error_count()} problem(s) in the {record_type.table} table)",
            "re-run the stage that writes this table; if it persists, report a bug",
        ) from exc


def write_table(path: Path, rows: list[Record] | list[dict[str, Any]] | pd.DataFrame,
                record_type: type[Record]) -> int:
    """Validate ``rows`` as ``record_type`` and write them to ``path`` atomically; returns count."""
    if isinstance(rows, pd.DataFrame):
        dict_rows = _frame_to_dicts(rows)
    else:
        dict_rows = [r.model_dump() if isinstance(r, Record) else dict(r) for r in rows]
    records = _validated_rows(record_type, dict_rows, str(path))
    keys = [getattr(r, record_type.key) for r in records]
    if len(set(keys)) != len(keys):
        raise InputDataError(
            f"{path}: duplicate {record_type.key} values in the {record_type.table} table",
            "each row needs a unique key; check the stage's inputs for repeated items",
        )
    schema = arrow_schema(record_type)
    columns = {name: [getattr(r, name) for r in records] for name in schema.names}
    table = pa.Table.from_pydict(columns, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return len(records)


def _frame_to_dicts(frame: pd.DataFrame) -> list[dict[str, Any]]:
    clean = frame.astype(object).where(frame.notna(), None)
    return clean.to_dict(orient="records")


def read_table(path: Path, record_type: type[Record], validate: bool = True) -> pd.DataFrame:
    """Read a table written by :func:`write_table`, checking its record type and version."""
    if not path.exists():
        raise InputDataError(
            f"{path} does not exist",
            "run the stage that writes it first (e.g. `dvc repro` or the matching `acrb` command)",
        )
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputDataError(f"{path} is not a readable Parquet file: {exc}",
                             "delete it and re-run the stage that writes it") from exc
    metadata = table.schema.metadata or {}
    found_table = metadata.get(b"acrb.table", b"?").decode()
    found_version = metadata.get(b"acrb.schema_version", b"?").decode()
    if found_table != record_type.table:
        raise InputDataError(
            f"{path} holds a '{found_table}' table, expected '{record_type.table}'",
            "check the path given to the stage",
        )
    if found_version != str(SCHEMA_VERSION):
        raise InputDataError(
            f"{path} was written with schema version {found_version}; this ACRB reads version "
            f"{SCHEMA_VERSION}",
            "re-run the stage that writes it with this version of ACRB (`dvc repro`)",
        )
    frame = table.to_pandas()
    if validate:
        _validated_rows(record_type, _frame_to_dicts(frame), str(path))
    return frame


def request_id_for(*, model_key: str, model_revision: str, settings: dict[str, Any],
                   source_sha256: str, prompt_text: str, seed: int, arm: str) -> str:
    """The content hash that names a request: equal inputs give equal ids on any machine."""
    return content_hash(
        {
            "model_key": model_key,
            "model_revision": model_revision,
            "settings": settings,
            "source_sha256": source_sha256,
            "prompt_text": prompt_text,
            "seed": seed,
            "arm": arm,
        }
    )


def dump_settings(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))
