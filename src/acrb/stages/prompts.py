"""Stage `prompts`: the prompt set, from the versioned catalog. Writes data/prompts/."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from acrb import layout
from acrb.prompts.catalog import catalog_prompt_records, load_catalog
from acrb.records import PromptRecord, write_table
from acrb.stages.context import StageContext
from acrb.tracking import stage_run


@dataclass(frozen=True)
class PromptsSummary:
    count: int
    per_category: dict[str, int]
    table: Path


def run(ctx: StageContext) -> PromptsSummary:
    cfg = ctx.params.prompts
    catalog_path = Path(cfg.catalog)
    catalog = load_catalog(catalog_path if catalog_path.is_absolute() else ctx.root / catalog_path)
    records = catalog_prompt_records(catalog, cfg.categories)
    table = ctx.path(layout.PROMPTS_TABLE)
    with stage_run("prompts", profile=ctx.profile, params_hash=ctx.params_hash) as tracker:
        write_table(table, records, PromptRecord)
        per_category = dict(sorted(Counter(r.category for r in records).items()))
        tracker.log_params({"prompts.catalog": catalog.label, "prompts.count": len(records)})
        tracker.log_metrics({f"prompts.count.{c}": n for c, n in per_category.items()})
    return PromptsSummary(count=len(records), per_category=per_category, table=table)
