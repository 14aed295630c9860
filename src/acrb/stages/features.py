"""Stage `features`: a feature prompt p_feat per source portrait, for the feature-prompt arm.

``features.describer`` picks who writes the seven observable descriptions
(:data:`~acrb.records.FEATURE_DIMENSIONS`): ``simulated`` reads them from the pixels offline
(the embedded default; an instrument, labelled ``origin: simulated``), ``vlm`` asks a
vision-language model through the judges' client layer (replies cached by content hash under
``features.cache_dir`` or ``$ACRB_CACHE_DIR/features``, so a rerun sends nothing), ``mapping``
imports a published ``{source_id or Race_Gender_Age cell: feature prompt}`` JSON (a source
whose id is not a key gets the prompt of its cell, from its labels; see
:mod:`acrb.features.mapping`). ``features.template`` joins the
descriptions into p_feat. No row ever carries a described prompt that names a race, ethnicity
or nationality: the VLM is asked again, and a source still without a clean answer stops the
stage; an imported mapping is used as published, its labelled prompts listed as warnings.

Writes ``data/features/features.parquet`` (one :class:`~acrb.records.FeaturePromptRecord` per
source) and ``data/features/summary.json``. Without a ``features`` section the table is empty,
so the stage still has its output and later stages read "no feature prompts" from it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from acrb import layout
from acrb.config import FeaturesParams
from acrb.detect.face import remember_faces_file
from acrb.errors import InputDataError
from acrb.records import FeaturePromptRecord, SourceRecord, read_table, write_table
from acrb.stages.context import StageContext
from acrb.storage import atomic_write_json, load_rgb, remove_stale_temporaries, sha256_file
from acrb.tracking import stage_run

CACHE_ENV = "ACRB_CACHE_DIR"


@dataclass(frozen=True)
class FeaturesSummary:
    describer: str
    count: int
    table: Path
    requests_sent: int = 0
    retried: int = 0
    warnings: dict[str, list[str]] = field(default_factory=dict)
    extra_ids: int = 0
    matched: dict[str, int] = field(default_factory=dict)  # mapping: source_id / cell -> sources


def _resolve(ctx: StageContext, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else ctx.root / path


def features_cache_dir(ctx: StageContext, cfg: FeaturesParams) -> Path:
    """Where VLM replies are cached: ``$ACRB_CACHE_DIR/features`` if set (for `dvc exp run
    --queue`, which runs in a temporary copy of the project), else ``features.cache_dir``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "features"
    return _resolve(ctx, cfg.cache_dir)


def run(ctx: StageContext) -> FeaturesSummary:
    cfg = ctx.params.features
    table = ctx.path(layout.FEATURES_TABLE)
    # Temporaries a killed run left (a rerun by command, not by DVC, keeps the folder).
    remove_stale_temporaries(ctx.path(layout.FEATURES_DIR))
    remember_faces_file(ctx.path(layout.SOURCE_FACES))  # located once, by the sources stage
    sources = read_table(ctx.path(layout.SOURCES_TABLE), SourceRecord)
    rows = [SourceRecord.model_validate(r) for r in
            sources.astype(object).where(sources.notna(), None).to_dict("records")]
    simulated = cfg is not None and cfg.describer == "simulated"
    with stage_run("features", profile=ctx.profile, params_hash=ctx.params_hash, params=ctx.params,
                   simulated=simulated) as tracker:
        if cfg is None:
            summary = FeaturesSummary(describer="", count=0, table=table)
            records: list[FeaturePromptRecord] = []
        elif cfg.describer == "mapping":
            records, summary = _mapped(ctx, cfg, rows, table)
        elif cfg.describer == "simulated":
            records, summary = _simulated(ctx, cfg, rows, table)
        else:
            records, summary = _described(ctx, cfg, rows, table)
        write_table(table, records, FeaturePromptRecord)
        atomic_write_json(ctx.path(layout.FEATURES_DIR / "summary.json"), _summary_json(
            cfg, summary, records))
        tracker.log_params({"features.describer": cfg.describer if cfg else "none",
                            "features.describer_id": summary.describer})
        tracker.log_metrics({"features.count": summary.count,
                             "features.requests_sent": summary.requests_sent,
                             "features.retried": summary.retried,
                             "features.label_warnings": len(summary.warnings)})
    if summary.warnings:
        print(f"features: {len(summary.warnings)} imported feature prompt(s) name a "
              "demographic group (listed in summary.json): "
              + ", ".join(summary.warnings), file=sys.stderr)
    return summary


def _summary_json(cfg: FeaturesParams | None, summary: FeaturesSummary,
                  records: list[FeaturePromptRecord]) -> dict[str, Any]:
    return {
        "describer": cfg.describer if cfg else None,
        "describer_id": summary.describer,
        "simulation": bool(cfg and cfg.describer == "simulated"),
        "template": cfg.template if cfg else None,
        "count": summary.count,
        "requests_sent": summary.requests_sent,
        "retried_sources": summary.retried,
        "rejected_answers": sum(len(r.rejected.split(";")) for r in records if r.rejected),
        "label_warnings": [{"source_id": s, "labels": labels}
                           for s, labels in summary.warnings.items()],
        "mapping_ids_without_source": summary.extra_ids,
        "mapping_matched": summary.matched,
        "note": None if cfg else "no `features` section in params: no feature prompts",
    }


def _source_file(ctx: StageContext, source: SourceRecord) -> Path:
    path = ctx.path(source.path)
    if not path.is_file():
        raise InputDataError(f"source image {path} of {source.source_id} is missing",
                             "run `acrb sources` (or `dvc repro sources`) first")
    return path


def _simulated(ctx: StageContext, cfg: FeaturesParams, sources: list[SourceRecord],
               table: Path) -> tuple[list[FeaturePromptRecord], FeaturesSummary]:
    from acrb.features.describe import dimensions_json, feature_text, simulated_describer_id
    from acrb.features.simulated import describe_pixels

    describer = simulated_describer_id()
    records = []
    for source in tqdm(sources, desc="features", unit="img", file=sys.stderr, disable=None):
        dimensions = describe_pixels(load_rgb(_source_file(ctx, source)))
        records.append(FeaturePromptRecord(
            source_id=source.source_id, source_sha256=source.sha256,
            text=feature_text(dimensions, cfg.template), dimensions=dimensions_json(dimensions),
            origin="simulated", describer=describer))
    return records, FeaturesSummary(describer=describer, count=len(records), table=table)


def _described(ctx: StageContext, cfg: FeaturesParams, sources: list[SourceRecord],
               table: Path) -> tuple[list[FeaturePromptRecord], FeaturesSummary]:
    from acrb.features.describe import (
        VLMDescriber,
        dimensions_json,
        failures_message,
        feature_text,
        load_instructions,
    )
    from acrb.registry import open_chat_client

    assert cfg.vlm is not None  # checked by FeaturesParams
    instructions = load_instructions(_resolve(ctx, cfg.instructions))
    images = {}
    for source in sources:
        path = _source_file(ctx, source)
        if sha256_file(path) != source.sha256:
            raise InputDataError(f"source image {path} does not match the sha256 in the "
                                 "sources table", "run `acrb sources` again")
        images[source.source_id] = path.read_bytes()
    with open_chat_client("features", cfg.vlm, features_cache_dir(ctx, cfg)) as client:
        describer = VLMDescriber(client, instructions, cfg.retries, cfg.vlm.structured_output)
        outcomes = describer.describe_many(images)
        sent = client.request_count
        describer_id = describer.describer_id
    failed = [o for o in outcomes if o.dimensions is None]
    if failed:
        raise failures_message(failed, cfg.retries)
    by_id = {s.source_id: s for s in sources}
    records = []
    for outcome in outcomes:
        assert outcome.dimensions is not None
        records.append(FeaturePromptRecord(
            source_id=outcome.source_id, source_sha256=by_id[outcome.source_id].sha256,
            text=feature_text(outcome.dimensions, cfg.template),
            dimensions=dimensions_json(outcome.dimensions), origin="vlm",
            describer=describer_id, attempts=outcome.attempts,
            rejected=";".join(r.replace(";", ",") for r in outcome.rejected)))
    return records, FeaturesSummary(
        describer=describer_id, count=len(records), table=table, requests_sent=sent,
        retried=sum(1 for o in outcomes if o.rejected))


def _mapped(ctx: StageContext, cfg: FeaturesParams, sources: list[SourceRecord],
            table: Path) -> tuple[list[FeaturePromptRecord], FeaturesSummary]:
    from acrb.features.mapping import read_mapping

    assert cfg.mapping is not None  # checked by FeaturesParams
    # The sources with their labels: a source whose id is not a key gets its cell's prompt.
    imported = read_mapping(_resolve(ctx, cfg.mapping), sources)
    return imported.records, FeaturesSummary(
        describer=imported.describer, count=len(imported.records), table=table,
        warnings=imported.labelled, extra_ids=imported.extra_ids, matched=imported.matched)
