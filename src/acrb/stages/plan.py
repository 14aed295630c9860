"""Stage `plan`: requests = sources x prompts x models x seeds x arms.

Each request is named by :func:`acrb.records.request_id_for`, a hash of everything that changes
the output, so a request that was already generated keeps its id (and its finished output) when
unrelated params change. Writes data/plan/requests.parquet.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pandas as pd

from acrb import layout
from acrb.errors import ConfigError
from acrb.records import (
    PromptRecord,
    RequestRecord,
    SourceRecord,
    dump_settings,
    read_table,
    request_id_for,
    write_table,
)
from acrb.registry import EDITORS
from acrb.stages.context import StageContext
from acrb.tracking import stage_run


@dataclass(frozen=True)
class PlanSummary:
    count: int
    per_model: dict[str, int]
    table: Path


def congruence(congruent_with: str, source: dict[str, str]) -> str:
    """congruent if the source belongs to a group the prompt is stereotypically linked with,
    incongruent if the prompt has such links but the source matches none, else neutral."""
    selectors = [s for s in congruent_with.split(";") if s]
    if not selectors:
        return "neutral"
    for selector in selectors:
        dimension, _, group = selector.partition(":")
        if source.get(dimension) == group:
            return "congruent"
    return "incongruent"


def build_requests(sources: pd.DataFrame, prompts: pd.DataFrame, ctx: StageContext
                   ) -> list[RequestRecord]:
    plan = ctx.params.plan
    source_rows = sources.to_dict(orient="records")
    editing = prompts[(prompts["mode"] == "i2i") & prompts["prompt_set"].isin(plan.prompt_sets)]
    if editing.empty:
        raise ConfigError(
            f"no I2I prompts in the prompt sets {plan.prompt_sets}",
            "for the `acrb` set, add `i2i` to prompts.synthesis.modes, or use plan.prompt_sets: "
            "[catalog]",
        )
    prompt_rows = editing.to_dict(orient="records")
    records = []
    categories = set(editing["category"])
    for name, entry in ctx.params.models.items():
        EDITORS.load(entry.key).check_categories(name, entry.typed_config(), categories)
        revision = entry.resolved_revision()
        settings = dump_settings(entry.settings)
        for source, prompt, seed, arm in product(source_rows, prompt_rows, plan.seeds, plan.arms):
            request_id = request_id_for(
                model_key=entry.key, model_revision=revision, settings=entry.settings,
                source_sha256=source["sha256"], prompt_text=prompt["text"], seed=seed, arm=arm,
            )
            records.append(RequestRecord(
                request_id=request_id, model=name, model_key=entry.key, model_revision=revision,
                settings=settings, source_id=source["source_id"], source_path=source["path"],
                source_sha256=source["sha256"], prompt_id=prompt["prompt_id"],
                prompt_text=prompt["text"], category=prompt["category"],
                attribute=prompt["attribute"],
                congruence=congruence(prompt["congruent_with"], source),  # type: ignore[arg-type]
                seed=seed, arm=arm, race=source["race"], gender=source["gender"],
                age=source["age"],
            ))
    return records


def run(ctx: StageContext) -> PlanSummary:
    ctx.params.check_model_configs()  # the first stage that uses models: fail before any work
    sources = read_table(ctx.path(layout.SOURCES_TABLE), SourceRecord)
    prompts = read_table(ctx.path(layout.PROMPTS_TABLE), PromptRecord)
    with stage_run("plan", profile=ctx.profile, params_hash=ctx.params_hash) as tracker:
        records = build_requests(sources, prompts, ctx)
        table = ctx.path(layout.PLAN_TABLE)
        write_table(table, records, RequestRecord)
        per_model = dict(Counter(r.model for r in records))
        tracker.log_params({"plan.seeds": ctx.params.plan.seeds, "plan.arms": ctx.params.plan.arms})
        tracker.log_metrics({"plan.requests": len(records),
                             **{f"plan.requests.{m}": n for m, n in per_model.items()}})
    return PlanSummary(count=len(records), per_model=per_model, table=table)
