"""Stage `analyze`: rates, disparities and (for simulated models) planted vs measured.

Per model: R(a), E(a) and lightening rates per category x source group with Wilson intervals,
Δ = max − min per category and dimension with simultaneous intervals and Holm-corrected tests
(:mod:`acrb.analysis`). Writes data/analysis/<model>/*.parquet, metrics/audit.json (DVC metrics),
plots/*.csv (DVC plots) and plots/figures/*.png, and logs one MLflow run per model with the same
metric keys, so the MLflow compare view lines models up.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from acrb import layout
from acrb.analysis.congruence import scs_rows
from acrb.analysis.figures import model_comparison, scs_points, skin_tone_shift
from acrb.analysis.hypotheses import evaluate_hypotheses
from acrb.analysis.outcomes import OUTCOME_NAMES, OUTCOMES, outcome_phrase
from acrb.analysis.section import ModelSection, build_model_section, write_section
from acrb.config import ModelEntry
from acrb.records import JudgementRecord, read_table
from acrb.stages.context import StageContext
from acrb.storage import atomic_path, atomic_write_json
from acrb.tracking import stage_run

_REQUEST_COLUMNS = ["request_id", "source_id", "prompt_id", "category", "attribute",
                    "congruence", "seed", "race", "gender", "age"]


@dataclass(frozen=True)
class ModelAnalysis:
    model: str
    key: str
    simulated: bool
    frame: pd.DataFrame
    section: ModelSection
    metrics: dict[str, float]

    @property
    def rates(self) -> pd.DataFrame:
        return self.section.rates

    @property
    def disparities(self) -> pd.DataFrame:
        return self.section.disparities

    @property
    def planted(self) -> pd.DataFrame | None:
        return self.section.planted


def analysis_frame(ctx: StageContext, model: str) -> pd.DataFrame:
    """One row per planned request: its design factors joined with its judgement."""
    requests = ctx.model_requests(model)[_REQUEST_COLUMNS]
    judgements = read_table(ctx.path(layout.judgements_table(model)), JudgementRecord)
    frame = requests.merge(
        judgements[["request_id", "status", *OUTCOMES, "ita_shift", "edit_fraction",
                    "needs_review"]],
        on="request_id", how="left", validate="one_to_one",
    )
    frame["status"] = frame["status"].fillna("missing")
    for column in OUTCOMES:
        frame[column] = frame[column].astype("boolean")
    return frame


def add_planted(frame: pd.DataFrame, entry: ModelEntry) -> pd.DataFrame:
    """Per-request planted probabilities, from the simulated editor's published config."""
    editor = entry.build()
    design = ["category", "race", "gender", "age"]
    cells = frame[design].drop_duplicates()
    planted = [
        editor.planted_probabilities(  # type: ignore[attr-defined]
            row.category, {"race": row.race, "gender": row.gender, "age": row.age}
        )
        for row in cells.itertuples(index=False)
    ]
    table = cells.assign(
        planted_refusal=[p["refusal"] for p in planted],
        planted_erasure=[p["erasure"] for p in planted],
        planted_lightening=[p["lightening"] for p in planted],
    )
    return frame.merge(table, on=design, how="left")


def metric_dict(rates: pd.DataFrame, gaps: pd.DataFrame, planted: pd.DataFrame | None,
                frame: pd.DataFrame) -> dict[str, float]:
    """Flat metric keys shared by every model (MLflow and metrics/audit.json)."""
    metrics: dict[str, float] = {
        "requests.total": float(len(frame)),
        "requests.error": float((frame["status"] == "error").sum()),
        "requests.missing": float((frame["status"] == "missing").sum()),
    }
    for outcome in OUTCOMES:
        label = OUTCOME_NAMES[outcome].metric
        out_gaps = gaps[gaps["outcome"] == outcome]
        pooled = out_gaps[out_gaps["category"] == "all"]
        metrics[f"delta_{label}"] = float(pooled["delta"].max()) if len(pooled) else math.nan
        metrics[f"flagged.{label}"] = float(out_gaps["flagged"].sum())
        for row in out_gaps.to_dict("records"):
            cell = (row["dimension"] if row["category"] == "all"
                    else f"{row['category']}.{row['dimension']}")
            metrics[f"delta_{label}.{cell}"] = float(row["delta"])
            metrics[f"delta_{label}.{cell}.ci_low"] = float(row["ci_low"])
            metrics[f"delta_{label}.{cell}.ci_high"] = float(row["ci_high"])
        out_rates = rates[rates["outcome"] == outcome]
        for row in out_rates.to_dict("records"):
            cell = (f"{row['dimension']}.{row['value']}" if row["category"] == "all"
                    else f"{row['category']}.{row['dimension']}.{row['value']}")
            metrics[f"{label}_rate.{cell}"] = float(row["rate"])
    if planted is not None:
        for outcome in OUTCOMES:
            label = OUTCOME_NAMES[outcome].metric
            rows = planted[planted["outcome"] == outcome]
            deltas = rows[rows["value"] == "Δ"]
            if len(deltas):
                metrics[f"planted.delta_{label}.coverage"] = float(deltas["covered"].mean())
            if len(rows):
                metrics[f"planted.{label}_rate.coverage"] = float(
                    rows[rows["value"] != "Δ"]["covered"].mean())
    return {k: (round(v, 6) if not math.isnan(v) else v) for k, v in metrics.items()}


def analyze_model(ctx: StageContext, model: str) -> ModelAnalysis:
    entry = ctx.params.model(model)
    cfg = ctx.params.analyze
    simulated = entry.model_class().simulated
    frame = analysis_frame(ctx, model)
    if simulated:
        frame = add_planted(frame, entry)
    section = build_model_section(frame, model, entry.key, simulated,
                                  ctx.path(layout.PLOTS_DIR / "figures"), cfg.confidence,
                                  cfg.alpha, simultaneous=cfg.simultaneous_intervals,
                                  permutations=cfg.permutations, seed=cfg.seed,
                                  bootstrap=cfg.bootstrap, resample=cfg.resample,
                                  power=cfg.power, tests=True)
    metrics = metric_dict(section.rates, section.disparities, section.planted, frame)
    return ModelAnalysis(model=model, key=entry.key, simulated=simulated, frame=frame,
                         section=section, metrics=metrics)


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")


def run(ctx: StageContext) -> list[ModelAnalysis]:
    """Analyse every model, then what needs all of them; write, then log one run per model."""
    # Simulated editors' planted values come from their typed configs: a bad key is reported
    # with its name here too, not as a raw validation error, when analyze is run by hand.
    ctx.params.check_model_configs()
    cfg = ctx.params.analyze
    results = []
    for model in tqdm(ctx.params.models, desc="analyze", unit="model", file=sys.stderr):
        result = analyze_model(ctx, model)
        write_section(result.section, ctx.path(layout.ANALYSIS_DIR / model), ctx.root)
        results.append(result)
    cross_model(ctx, results)
    _write_dvc_outputs(ctx, results)
    for result in results:
        entry = ctx.params.models[result.model]
        with stage_run("analyze", profile=ctx.profile, params_hash=ctx.params_hash,
                       model=result.model, simulated=result.simulated) as tracker:
            tracker.log_params({"model": result.model, "model_key": entry.key,
                                "model_revision": entry.resolved_revision(),
                                "confidence": cfg.confidence, "alpha": cfg.alpha,
                                "simultaneous_intervals": cfg.simultaneous_intervals,
                                "bootstrap": cfg.bootstrap, "permutations": cfg.permutations,
                                "resample": cfg.resample, "seed": cfg.seed})
            tracker.log_metrics(result.metrics)
            tracker.log_artifact(ctx.path(layout.ANALYSIS_DIR / result.model), "tables")
            for figure in result.section.figures:
                tracker.log_artifact(figure.path, "figures")
    return results


def cross_model(ctx: StageContext, results: list[ModelAnalysis]) -> None:
    """What needs every model at once: the hypotheses table, SCS, the comparison figures.

    Writes ``data/analysis/hypotheses.parquet``, ``data/analysis/scs.parquet`` and figures,
    adds each model's hypothesis verdicts to its metrics, and logs an ``analyze-compare`` MLflow
    run.
    """
    cfg = ctx.params.analyze
    frames = {r.model: r.frame for r in results}
    gaps = {r.model: r.disparities for r in results}
    hypotheses = evaluate_hypotheses(frames, gaps, cfg)
    scs_table = pd.concat(
        [scs_rows(r.frame, "hard_refusal", n_boot=cfg.bootstrap, seed=cfg.seed,
                  confidence=cfg.confidence, resample=cfg.resample).assign(model=r.model)
         for r in results],
        ignore_index=True,
    )
    out = ctx.path(layout.ANALYSIS_DIR)
    _write_parquet(hypotheses, out / "hypotheses.parquet")
    _write_parquet(scs_table, out / "scs.parquet")
    figure_dir = ctx.path(layout.PLOTS_DIR / "figures")
    figures = [scs_points(scs_table, "Stereotype congruence score (hard refusal)",
                          figure_dir / "compare-scs.png")]
    all_gaps = pd.concat([g.assign(model=m) for m, g in gaps.items()], ignore_index=True)
    for outcome in ("hard_refusal", "erasure"):
        figures.append(model_comparison(
            all_gaps, outcome, "race", f"Δ {outcome_phrase(outcome)} by race, per model",
            figure_dir / f"compare-{outcome}-race.png"))
    for r in results:
        if r.frame["ita_shift"].notna().any():
            figures.append(skin_tone_shift(r.frame, "race", f"{r.model}: skin-tone shift",
                                           figure_dir / f"{r.model}-ita-shift-race.png"))
    for r in results:
        for row in hypotheses.to_dict("records"):
            if row["model"] == r.model or r.model in str(row["model"]).split(", "):
                name = row["hypothesis"]
                r.metrics[f"hypothesis.{name}.p_adjusted"] = float(row["p_adjusted"])
                r.metrics[f"hypothesis.{name}.supported"] = (
                    math.nan if pd.isna(row["supported"]) else float(bool(row["supported"])))
        for row in scs_table[scs_table["model"] == r.model].to_dict("records"):
            r.metrics[f"scs.{row['category']}"] = float(row["estimate"])
    # Its own stage tag, so that the `analyze` runs stay one per model (the compare view).
    with stage_run("analyze-compare", profile=ctx.profile, params_hash=ctx.params_hash,
                   simulated=ctx.params.profile.simulation) as tracker:
        tracker.log_artifact(out / "hypotheses.parquet", "tables")
        tracker.log_artifact(out / "scs.parquet", "tables")
        for path in figures:
            tracker.log_artifact(path, "figures")


def _write_dvc_outputs(ctx: StageContext, results: list[ModelAnalysis]) -> None:
    atomic_write_json(ctx.path(layout.METRICS_FILE), {r.model: r.metrics for r in results})
    deltas = []
    rate_rows = []
    for r in results:
        gaps = r.disparities.assign(model=r.model)
        if r.planted is not None:
            planted = r.planted[r.planted["value"] == "Δ"][
                ["outcome", "category", "dimension", "planted"]]
            gaps = gaps.merge(planted, on=["outcome", "category", "dimension"], how="left")
        deltas.append(gaps)
        rate_rows.append(r.rates.assign(model=r.model))
    delta_frame = pd.concat(deltas, ignore_index=True)
    delta_frame["cell"] = delta_frame["category"] + "/" + delta_frame["dimension"]
    columns = ["model", "outcome", "cell", "category", "dimension", "delta", "ci_low", "ci_high",
               "max_group", "min_group", "p_adjusted", "flagged"]
    if "planted" in delta_frame:
        columns.append("planted")
    _write_csv(delta_frame[columns], ctx.path(layout.PLOTS_DIR / "delta.csv"))
    rates = pd.concat(rate_rows, ignore_index=True)
    rates["group"] = rates["dimension"] + ":" + rates["value"]
    _write_csv(rates[["model", "outcome", "category", "group", "n", "k", "rate", "ci_low",
                      "ci_high"]], ctx.path(layout.PLOTS_DIR / "rates.csv"))
