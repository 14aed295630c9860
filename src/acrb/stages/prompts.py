"""Stage `prompts`: the I2I catalog plus ACRB prompt synthesis. Writes data/prompts/.

Outputs: ``prompts.parquet`` (every prompt, with its provenance), ``synthesis_calls.parquet``
(every LLM call with its reply; empty for the template writer), ``summary.json`` (counts) and a
browsable sample, ``sample.md`` and ``sample.html``.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from acrb import layout
from acrb.config import SynthesisParams
from acrb.prompts.catalog import catalog_prompt_records, load_catalog
from acrb.prompts.synthesis import (
    llm_prompts,
    load_attributes,
    load_base_prompts,
    plan_items,
    template_prompts,
)
from acrb.records import PromptRecord, SynthesisCallRecord, write_table
from acrb.stages.context import StageContext
from acrb.storage import atomic_path
from acrb.tracking import stage_run

CACHE_ENV = "ACRB_CACHE_DIR"


@dataclass(frozen=True)
class PromptsSummary:
    count: int
    per_category: dict[str, int]
    table: Path
    synthesized: dict[str, int] = field(default_factory=dict)  # mode -> rows
    per_synthesis: dict[str, int] = field(default_factory=dict)  # template/llm -> rows
    fallbacks: dict[str, int] = field(default_factory=dict)  # refused/unusable/error -> rows
    backend: str = ""
    llm_requests: int = 0
    sample: Path | None = None


def _resolve(ctx: StageContext, path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else ctx.root / path


def llm_cache_dir(ctx: StageContext, cfg: SynthesisParams) -> Path:
    """Where LLM replies are cached: ``$ACRB_CACHE_DIR/llm`` if set (for `dvc exp run --queue`,
    which runs in a temporary copy of the project), else ``synthesis.cache_dir``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "llm"
    return _resolve(ctx, cfg.cache_dir)


def synthesize(ctx: StageContext, cfg: SynthesisParams
               ) -> tuple[list[PromptRecord], list[SynthesisCallRecord], int, dict]:
    """ACRB rows, LLM call log, requests sent, and the writer's description."""
    base = load_base_prompts(_resolve(ctx, cfg.base_prompts))
    attributes = load_attributes(_resolve(ctx, cfg.attributes))
    items = plan_items(base, attributes, cfg.modes, cfg.domains)
    label = f"{base.label}+{attributes.label}"
    if cfg.backend == "template":
        return template_prompts(items, attributes, label), [], 0, {"backend": "template"}
    from acrb.registry import open_chat_client

    client = open_chat_client(cfg.backend, cfg.backends[cfg.backend], llm_cache_dir(ctx, cfg))
    try:
        result = llm_prompts(items, attributes, label, client, min_chars=cfg.min_chars,
                             max_chars=cfg.max_chars)
        return result.prompts, result.calls, result.requests_sent, client.describe()
    finally:
        client.close()


def sample_rows(rows: list[PromptRecord], per_domain: int) -> list[PromptRecord]:
    """``per_domain`` rows per mode and domain, drawn with a seed made of the mode and domain
    (the same sample on every run and machine), sorted by id."""
    groups: dict[tuple[str, str], list[PromptRecord]] = {}
    for row in sorted(rows, key=lambda r: r.prompt_id):
        groups.setdefault((row.mode, row.domain), []).append(row)
    picked = []
    for (mode, domain), group in sorted(groups.items()):
        draw = random.Random(f"{mode}/{domain}").sample(group, min(per_domain, len(group)))
        picked += sorted(draw, key=lambda r: r.prompt_id)
    return picked


_SAMPLE_HTML = jinja2.Environment(autoescape=True).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ACRB prompt sample</title>
<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.fb{color:#a40}</style></head><body>
<h1>ACRB prompt sample</h1>
<p>{{ summary }}</p>
<table><thead><tr><th>id</th><th>mode</th><th>domain</th><th>attribute</th><th>prompt</th>
<th>synthesis</th><th>fallback</th></tr></thead><tbody>
{% for r in rows %}<tr><td>{{ r.prompt_id }}</td><td>{{ r.mode }}</td><td>{{ r.domain }}</td>
<td>{{ r.attribute }}</td><td>{{ r.text }}</td><td>{{ r.synthesis }}{% if r.llm_model %}
({{ r.llm_backend }}: {{ r.llm_model }}){% endif %}</td><td class="fb">{{ r.fallback }}</td></tr>
{% endfor %}</tbody></table></body></html>
""")


def write_sample(folder: Path, rows: list[PromptRecord], summary: str) -> Path:
    """sample.md and sample.html beside the table; returns the HTML path."""
    def cell(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    lines = [f"# ACRB prompt sample\n\n{summary}\n",
             "| id | mode | domain | attribute | prompt | synthesis | fallback |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        made = r.synthesis + (f" ({r.llm_backend}: {r.llm_model})" if r.llm_model else "")
        lines.append("| " + " | ".join(cell(v) for v in (
            r.prompt_id, r.mode, r.domain, r.attribute, r.text, made, r.fallback)) + " |")
    with atomic_path(folder / "sample.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    html = folder / "sample.html"
    with atomic_path(html) as tmp:
        tmp.write_text(_SAMPLE_HTML.render(rows=rows, summary=summary))
    return html


def _metric_name(value: str) -> str:
    return value.replace(":", ".")


def run(ctx: StageContext) -> PromptsSummary:
    cfg = ctx.params.prompts
    catalog = load_catalog(_resolve(ctx, cfg.catalog))
    records = catalog_prompt_records(catalog, cfg.categories, cfg.ids)
    calls: list[SynthesisCallRecord] = []
    acrb: list[PromptRecord] = []
    sent = 0
    writer: dict[str, Any] = {}
    folder = ctx.path(layout.PROMPTS_DIR)
    with stage_run("prompts", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params) as tracker:
        if cfg.synthesis is not None:
            acrb, calls, sent, writer = synthesize(ctx, cfg.synthesis)
        table = ctx.path(layout.PROMPTS_TABLE)
        write_table(table, records + acrb, PromptRecord)
        write_table(folder / "synthesis_calls.parquet", calls, SynthesisCallRecord)

        per_category = dict(sorted(Counter(r.category for r in records).items()))
        synthesized: dict[str, int] = dict(sorted(Counter(r.mode for r in acrb).items()))
        per_synthesis: dict[str, int] = dict(sorted(Counter(r.synthesis for r in acrb).items()))
        fallbacks = dict(sorted(Counter(r.fallback.split(":")[0].replace("boundary ", "")
                                        for r in acrb if r.fallback).items()))
        counts: dict[str, float] = {f"prompts.count.{c}": n for c, n in per_category.items()}
        for mode in synthesized:
            rows = [r for r in acrb if r.mode == mode]
            counts[f"prompts.acrb.{mode}.count"] = len(rows)
            for what, values in (("domain", Counter(r.domain for r in rows)),
                                 ("attribute", Counter(r.attribute for r in rows)),
                                 ("synthesis", Counter(r.synthesis for r in rows))):
                counts.update({f"prompts.acrb.{mode}.{what}.{_metric_name(k)}": n
                               for k, n in values.items()})
        counts.update({f"prompts.acrb.fallback.{k}": n for k, n in fallbacks.items()})
        counts["prompts.acrb.llm_requests"] = sent
        summary = {"catalog": catalog.label, "catalog_per_category": per_category,
                   "acrb_per_mode": synthesized, "acrb_per_synthesis": per_synthesis,
                   "acrb_fallbacks": fallbacks, "llm_requests": sent, "writer": writer}
        with atomic_path(folder / "summary.json") as tmp:
            tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        sample = None
        if acrb:
            modes = ", ".join(f"{m}: {n:,}" for m, n in synthesized.items())
            text = (f"{len(acrb):,} ACRB prompts ({modes}), written by "
                    f"{writer.get('backend', 'template')}; {sum(fallbacks.values())} fell back "
                    "to the template.")
            sample = write_sample(folder, sample_rows(acrb, cfg.synthesis.sample_per_domain
                                                      if cfg.synthesis else 0), text)
            tracker.log_artifact(sample, "prompts")
            tracker.log_artifact(folder / "sample.md", "prompts")
        tracker.log_params({"prompts.catalog": catalog.label, "prompts.count": len(records),
                            **{f"prompts.synthesis.{k}": v for k, v in writer.items()}})
        tracker.log_metrics(counts)
        tracker.log_dataset(table, "prompts")
    return PromptsSummary(count=len(records), per_category=per_category, table=table,
                          synthesized=synthesized, per_synthesis=per_synthesis,
                          fallbacks=fallbacks, backend=writer.get("backend", ""),
                          llm_requests=sent, sample=sample)
