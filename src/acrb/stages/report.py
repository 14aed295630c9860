"""Stage `report`: one self-contained HTML report and LaTeX tables from the analysis outputs.

Reads data/analysis/ (per-model tables, the hypotheses and SCS tables), the human review's
tables under data/review/analysis/ when that stage ran, the paper's tables under data/tables/
when the ``tables`` stage ran, and the figures under plots/figures/;
writes reports/report.html (figures inline, no external resources, labelled SIMULATION when
any model is simulated) and reports/tables/*.tex (booktabs), and logs them to
MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from acrb import __version__, layout
from acrb.analysis.agreement.judging import JudgingTables, read_judging
from acrb.analysis.outcomes import OUTCOMES, outcome_phrase
from acrb.analysis.outputs.latex import (
    attribute_disparities_table,
    disparities_table,
    hypotheses_table,
    judge_means_table,
)
from acrb.analysis.outputs.paper_tables import read_paper_tables
from acrb.analysis.outputs.report import render_report
from acrb.analysis.outputs.review_report import read_review, review_view
from acrb.analysis.outputs.section import FigureRef, ModelSection
from acrb.analysis.outputs.t2i_section import AttributeSection, read_any_section
from acrb.rounds import PROGRESS_FILE
from acrb.stages.context import StageContext
from acrb.storage import atomic_write_text
from acrb.tracking import stage_run

TABLES_DIR = Path("reports") / "tables"


def _comparison_figures(ctx: StageContext) -> list[FigureRef]:
    figures = ctx.path(layout.PLOTS_DIR / "figures")
    found = [FigureRef("compare", "Stereotype congruence score per model and category",
                       figures / "compare-scs.png")]
    for outcome in ("hard_refusal", "erasure"):
        found.append(FigureRef("compare", f"Δ {outcome_phrase(outcome)} by race, per model",
                               figures / f"compare-{outcome}-race.png"))
    for model in ctx.params.models:
        found.append(FigureRef("compare", f"{model}: skin-tone (ITA) shift by race",
                               figures / f"{model}-ita-shift-race.png"))
    return [f for f in found if f.path.exists()]


def write_latex(ctx: StageContext, sections: list[ModelSection],
                hypotheses: pd.DataFrame | None,
                t2i_sections: list[AttributeSection] | None = None,
                judging: dict[str, JudgingTables] | None = None) -> Path:
    """reports/tables/: one booktabs table per model and outcome, the hypotheses table, per
    text-to-image model its Δ over prompt attributes (``<model>-t2i-hard_refusal-delta``), and
    with judges the mean judge score per axis across models (``judge-means``)."""
    out = ctx.path(TABLES_DIR)
    confidence = ctx.params.analyze.confidence
    judge_means = out / "judge-means.tex"
    if judging:
        atomic_write_text(judge_means, judge_means_table(
            {model: tables.means for model, tables in judging.items()}, confidence))
    else:
        judge_means.unlink(missing_ok=True)
    for t2i in t2i_sections or []:
        atomic_write_text(out / f"{t2i.slug}-t2i-hard_refusal-delta.tex",
                          attribute_disparities_table(t2i.disparities, t2i.planted, t2i.slug,
                                                      confidence, t2i.equivalence))
    for section in sections:
        for outcome in OUTCOMES:
            if (section.disparities["outcome"] == outcome).any():
                atomic_write_text(out / f"{section.slug}-{outcome}-delta.tex",
                                  disparities_table(section.disparities, section.slug, outcome,
                                                    confidence))
    if hypotheses is not None:
        atomic_write_text(out / "hypotheses.tex", hypotheses_table(hypotheses))
    return out


def _sequential_summaries(ctx: StageContext) -> list[dict[str, Any]]:
    """The sequential audits' summaries ``analyze`` wrote (``plan.sequential``), by model."""
    found = []
    for model in ctx.params.models:
        path = ctx.path(layout.ANALYSIS_DIR / model / PROGRESS_FILE)
        if ctx.params.plan.sequential is not None and path.is_file():
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def run(ctx: StageContext) -> Path:
    """Render reports/report.html and reports/tables/ from what `analyze` wrote; returns the
    report's path. Nothing is computed here: the numbers come from data/analysis/."""
    read = [read_any_section(ctx.path(layout.ANALYSIS_DIR / model), ctx.root)
            for model in ctx.params.models]
    sections = [s for s in read if isinstance(s, ModelSection)]
    t2i_sections = [s for s in read if isinstance(s, AttributeSection)]
    simulated = ctx.params.profile.simulation or any(s.simulated for s in read)
    judging = {}
    for section in sections:
        judged = read_judging(ctx.path(layout.ANALYSIS_DIR / section.slug))
        if judged is not None:
            judging[section.slug] = judged
    planted_path = ctx.path(layout.ANALYSIS_DIR / "judges_planted.parquet")
    planted_judges = pd.read_parquet(planted_path) if planted_path.exists() else None
    cfg = ctx.params.analyze
    hypotheses_path = ctx.path(layout.ANALYSIS_DIR / "hypotheses.parquet")
    hypotheses = pd.read_parquet(hypotheses_path) if hypotheses_path.exists() else None
    run_info = {
        "profile": ctx.profile,
        "acrb_version": __version__,
        "params_hash": ctx.params_hash,
        # No clock time, git commit or commit date: the report is an output recorded in the
        # dvc.lock committed after it, so any of them would make every clone's rerun differ
        # from the committed lock (MLflow's runs carry the commit and the time).
    }
    method = {"clustered": True, "bootstrap": cfg.bootstrap, "permutations": cfg.permutations,
              "resample": cfg.resample, "test": cfg.test, "alpha": cfg.alpha,
              "power_percent": round(100 * cfg.power)}
    with stage_run("report", profile=ctx.profile, params_hash=ctx.params_hash, params=ctx.params,
                   simulated=simulated) as tracker:
        path = render_report(
            sections, run_info, ctx.path(layout.REPORT_FILE), simulated,
            simultaneous_intervals=cfg.simultaneous_intervals, hypotheses=hypotheses,
            comparison_figures=_comparison_figures(ctx), method=method,
            t2i_models=t2i_sections, judging=judging, planted_judges=planted_judges,
            review=review_view(read_review(ctx.path(layout.REVIEW_ANALYSIS_DIR))),
            paper_tables=read_paper_tables(ctx.path(layout.TABLES_DIR)),
            sequential=_sequential_summaries(ctx),
            title=ctx.params.report.title,
        )
        tables = write_latex(ctx, sections, hypotheses, t2i_sections, judging)
        tracker.log_artifact(path)
        tracker.log_artifact(tables, "tables")
    return path
