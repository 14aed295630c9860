"""Stage `review`: people's ratings of the review set, how far they agree, how the judges compare
with them, and the judge-corrected rates.

The ratings come from ``inputs/review/`` (``review.ratings: inputs``: what ``acrb review
finalize`` or ``acrb review import-survey`` wrote) or from the simulated raters of
:mod:`acrb.review.simulated` (``review.ratings: simulated``, the embedded default: planted
noise, never a measurement of people). From them (:mod:`acrb.analysis.agreement.raters`,
:mod:`acrb.analysis.agreement.corrected`):

- agreement between raters per axis and arm (edited, feature, both pooled): Fleiss' kappa
  (deterministic, generalised to unequal numbers of ratings) and Krippendorff's alpha (ordinal
  and interval side by side), overall, per model and per source group, with bootstrap
  intervals over items; consistency of each rater on repeated items;
- imported survey items matched to the run's requests (:mod:`acrb.review.matching`: model
  through ``review.model_aliases``, prompt id, source cell) so the judges can be compared with
  people on them; every imported item's match or reason is in ``survey_matches.csv``;
- the judges against the human consensus per axis and group (weighted kappa, Spearman, mean
  signed difference), and per race the share of each outcome people see that the judges miss,
  on the random sample only (the items added because the judges disagreed are not
  representative of the judges' errors);
- Kruskal-Wallis across races, and Kruskal-Wallis and Mann-Whitney between genders, on the
  consensus; Wilcoxon between the edited and feature-prompt outputs when the set has pairs;
- per model, for each judge outcome whose axis people rate: the judge-only, human-only and
  judge-corrected (prediction-powered) rate of every source group, and the race Δ by each.

The human consensus is the median or mean of the raters (``review.consensus``).

Writes ``data/review/analysis/*.parquet`` (the ratings analysed included),
``metrics/review/`` (small DVC metrics files), ``data/review/analysis/metrics.csv`` (every
flat metric) and one MLflow run.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from acrb import layout
from acrb.analysis.agreement import corrected, raters
from acrb.analysis.frame import SOURCE_DIMENSIONS
from acrb.analysis.inputs import PLAIN_ARM, REQUEST_COLUMNS, analysis_frame, read_verdicts
from acrb.analysis.outcomes import OUTCOME_NAMES
from acrb.analysis.outputs.headline import (
    delta_keys,
    headline_value,
    write_detailed_metrics,
    write_headline,
)
from acrb.config import OutcomeRule
from acrb.demographics import REFERENCE_RACE
from acrb.errors import InputDataError
from acrb.records import (
    REVIEW_AXES,
    JudgementRecord,
    RatingRecord,
    RequestRecord,
    ReviewItemRecord,
    VerdictRecord,
    read_table,
    write_table,
)
from acrb.review.matching import MATCH_COLUMNS, match_survey_items
from acrb.stages.context import StageContext
from acrb.storage import atomic_path, atomic_write_json, remove_stale_temporaries, write_csv
from acrb.tracking import stage_run

#: The arm whose outputs the audit's rates count (see :mod:`acrb.stages.review_set`).

#: Tables this stage writes under ``data/review/analysis``.
TABLES = ("agreement", "consistency", "judge_human", "judge_misses", "group_tests",
          "arm_tests", "group_means", "corrected_rates", "corrected_deltas")
#: Every imported survey item and how it was matched to a request of the run (or why not).
MATCHES_FILE = "survey_matches.csv"


@dataclass(frozen=True)
class ReviewSummary:
    origin: str
    items: int
    ratings: int
    raters: int
    out_dir: Path
    metrics: dict[str, float]


def review_outcomes(rules: dict[str, OutcomeRule], axes: Sequence[str] = REVIEW_AXES
                    ) -> dict[str, OutcomeRule]:
    """The judge outcomes people can check: those read from an axis they rate (``axes``,
    :func:`acrb.analysis.agreement.raters.rated_axes` of the ratings)."""
    return {name: rule for name, rule in rules.items() if rule.axis in axes}


def _readings(ctx: StageContext, models: list[str]) -> dict[str, Any]:
    # Only simulated ratings read the pixels (the detectors import scipy and skimage).
    from acrb.judges.simulated import pixel_readings

    readings: dict[str, Any] = {}
    for model in models:
        path = ctx.path(layout.judgements_table(model))
        if path.is_file():
            table = read_table(path, JudgementRecord).set_index("request_id")
            readings.update(pixel_readings(table, ctx.params.evaluate.thresholds))
    return readings


def load_ratings(ctx: StageContext, items: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                    str]:
    """(items, ratings, origin): the review set's items with any imported items added, the
    ratings to analyse and where they came from."""
    cfg = ctx.params.review
    if cfg.ratings == "simulated":
        from acrb.review.simulated import simulate_ratings

        readings = _readings(ctx, sorted(set(items["model"])))
        ratings = simulate_ratings(items, readings, cfg, ctx.params.evaluate.thresholds)
        return items, ratings, f"simulated (seed {cfg.simulated.seed})"
    path = ctx.path(layout.RATINGS_TABLE)
    if not path.is_file():
        raise InputDataError(
            f"review.ratings is 'inputs' but {layout.RATINGS_TABLE} does not exist",
            "rate the set with `acrb review serve` then `acrb review finalize`, or import a "
            "survey with `acrb review import-survey FILE`; or set review.ratings: simulated")
    ratings = read_table(path, RatingRecord)
    items_path = ctx.path(layout.REVIEW_ITEMS_TABLE)
    if items_path.is_file():
        extra = read_table(items_path, ReviewItemRecord)
        items = pd.concat([items, extra[~extra["item_id"].isin(items["item_id"])]],
                          ignore_index=True)
    unknown = sorted(set(ratings["item_id"]) - set(items["item_id"]))
    if unknown:
        raise InputDataError(
            f"{layout.RATINGS_TABLE} rates {len(unknown)} item(s) that are neither in the "
            f"review set nor in {layout.REVIEW_ITEMS_TABLE}, e.g. {unknown[0]!r}",
            "finalize the ratings from the rating app that served this review set, or import "
            "the survey again (it writes the items beside the ratings)")
    origins = sorted(set(ratings["origin"]))
    return items, ratings, ", ".join(origins)


def match_imported(ctx: StageContext, items: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(items, matches): imported survey items (no request id) matched to the plan's requests
    (:func:`acrb.review.matching.match_survey_items`); the plan is read only when there are
    such items. Without a plan every imported item is listed unmatched."""
    if not items["request_id"].isna().any():
        return items, pd.DataFrame(columns=list(MATCH_COLUMNS))
    plan = ctx.path(layout.PLAN_TABLE)
    requests = read_table(plan, RequestRecord) if plan.is_file() else \
        pd.DataFrame(columns=list(RequestRecord.model_fields))
    return match_survey_items(items, requests, ctx.params.review.model_aliases)


def ratings_kind(origin: str) -> str:
    """Where ratings come from, in words, from their ``origin`` values (comma-separated)."""
    kinds = {o.split(":", 1)[0].strip() for o in origin.split(",") if o.strip()}
    words = {"simulated": "simulated raters", "survey": "people, imported from a survey "
             "export", "app": "people in the rating app"}
    return " and ".join(words.get(k, k) for k in sorted(kinds)) or "unknown"


def raters_per_item(ratings: pd.DataFrame) -> str:
    """Distinct raters per rated item (repeats left out), as ``"3"`` or ``"3-6"``."""
    first = ratings.loc[~ratings["repeat"].astype(bool)]
    if first.empty:
        return "0"
    counts = first.groupby("item_id")["rater"].nunique()
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low}-{high}"


def _verdicts(ctx: StageContext, models: list[str],
              axes: Sequence[str] = REVIEW_AXES) -> pd.DataFrame:
    frames = []
    for model in models:
        path = ctx.path(layout.verdicts_table(model))
        if path.is_file():
            frames.append(read_table(path, VerdictRecord)[["request_id", *axes]])
    if not frames:
        return pd.DataFrame(columns=["request_id", *axes])
    return pd.concat(frames, ignore_index=True)


def _corrected(ctx: StageContext, ratings: pd.DataFrame, items: pd.DataFrame,
               models: list[str], axes: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per model and reviewable judge outcome: the rates and race/gender/age Δ by estimator."""
    confidence = ctx.params.analyze.confidence
    rates, deltas = [], []
    for model in models:
        if read_verdicts(ctx, model) is None:
            continue
        frame = analysis_frame(ctx, model, [*REQUEST_COLUMNS, "arm", "mode"])
        frame = frame[(frame["arm"] == PLAIN_ARM) & (frame["mode"] == "i2i")]
        model_items = items[items["model"] == model]
        for outcome, rule in review_outcomes(ctx.params.judge.outcomes, axes).items():
            if outcome not in frame.columns:
                continue
            human = corrected.human_outcomes(ratings, model_items, rule,
                                             consensus_rule=ctx.params.review.consensus)
            labelled = corrected.labelled_frame(frame, outcome, human)
            rates.append(corrected.corrected_rates(labelled, outcome, confidence=confidence)
                         .assign(model=model))
            for dimension in SOURCE_DIMENSIONS:
                deltas.append(corrected.corrected_deltas(labelled, outcome, dimension,
                                                         confidence=confidence)
                              .assign(model=model))
    rate_columns = ["model", *corrected.CORRECTED_RATE_COLUMNS]
    delta_columns = ["model", *corrected.CORRECTED_DELTA_COLUMNS]
    return (pd.concat(rates, ignore_index=True)[rate_columns] if rates
            else pd.DataFrame(columns=rate_columns),
            pd.concat(deltas, ignore_index=True)[delta_columns] if deltas
            else pd.DataFrame(columns=delta_columns))


def _metric(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return None
    return round(float(value), 6)


def review_metrics(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Flat metrics (DVC and MLflow): overall rater agreement per arm, axis and statistic
    (``review.agreement.<arm>.<axis>.<statistic>``), judge-human kappa per axis, and per model
    and outcome the race Δ by each estimator with its interval."""
    out: dict[str, float | None] = {}
    agree = tables["agreement"]
    overall = agree[agree["dimension"] == raters.ALL]
    for _, row in overall.iterrows():
        out[f"review.agreement.{row['arm']}.{row['axis']}.{row['statistic']}"] = _metric(
            row["estimate"])
    jh = tables["judge_human"]
    for _, row in jh[jh["dimension"] == raters.ALL].iterrows():
        out[f"review.judge_human.{row['axis']}.weighted_kappa"] = _metric(row["weighted_kappa"])
        out[f"review.judge_human.{row['axis']}.mean_difference"] = _metric(
            row["mean_difference"])
    deltas = tables["corrected_deltas"]
    for _, row in deltas[deltas["dimension"] == "race"].iterrows():
        key = f"review.{row['model']}.{row['outcome']}.delta_race.{row['estimator']}"
        out[key] = _metric(row["delta"])
        out[f"{key}.ci_low"] = _metric(row["ci_low"])
        out[f"{key}.ci_high"] = _metric(row["ci_high"])
    return {k: v for k, v in out.items() if v is not None}


def review_headline(tables: dict[str, pd.DataFrame]) -> dict[Path, dict[str, Any]]:
    """The review's headline DVC metrics, in rows that share their keys with the audit's
    (:mod:`acrb.analysis.outputs.headline`): per model and outcome the judge-corrected (``ppi``) Δ
    by race with its interval (``<model>/<outcome>.json``: ``race``, ``race_lb``, ``race_ub``), and
    per rated axis the raters' agreement over both arms pooled and the judge-human kappa
    (``agreement/<axis>.json``: ``alpha_interval`` and ``alpha_ordinal``, Krippendorff's alpha at
    the interval level (the figure the study's paper quotes) and the ordinal level; ``kappa``,
    Fleiss'; ``judge_kappa``, weighted). Missing values are null. Every flat metric, per arm, stays
    in ``data/review/analysis/metrics.csv``."""
    files: dict[Path, dict[str, Any]] = {}
    deltas = tables["corrected_deltas"]
    chosen = deltas[(deltas["dimension"] == "race") & (deltas["estimator"] == "ppi")]
    for row in chosen.to_dict("records"):
        label = OUTCOME_NAMES[row["outcome"]].metric if row["outcome"] in OUTCOME_NAMES \
            else str(row["outcome"])
        files[Path(str(row["model"])) / f"{label}.json"] = delta_keys("race", row)
    agree = tables["agreement"]
    overall = agree[(agree["dimension"] == raters.ALL) & (agree["arm"] == raters.BOTH)]
    jh = tables["judge_human"]
    jh = jh[jh["dimension"] == raters.ALL].set_index("axis")
    for axis, block in overall.groupby("axis", sort=True):
        by = dict(zip(block["statistic"], block["estimate"], strict=True))
        files[Path("agreement") / f"{axis}.json"] = {
            "alpha_interval": headline_value(by.get("alpha_interval")),
            "alpha_ordinal": headline_value(by.get("alpha_ordinal")),
            "kappa": headline_value(by.get("fleiss_kappa")),
            "judge_kappa": headline_value(jh["weighted_kappa"].get(axis))
            if axis in jh.index else None}
    return files


def run(ctx: StageContext) -> ReviewSummary:
    cfg = ctx.params.review
    set_path = ctx.path(layout.REVIEW_SET)
    if not set_path.is_file():
        raise InputDataError(f"no review set at {layout.REVIEW_SET}",
                             "run `acrb review sample` (or `dvc repro review_set`) first")
    items = read_table(set_path, ReviewItemRecord)
    out_dir = ctx.path(layout.REVIEW_ANALYSIS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Temporaries a killed run left (a rerun by command, not by DVC, keeps the folder).
    for folder in (out_dir, ctx.path(layout.REVIEW_METRICS_DIR)):
        remove_stale_temporaries(folder)
    items, ratings, origin = load_ratings(ctx, items)
    items, matches = match_imported(ctx, items)
    models = sorted(set(items["model"]))
    simulated = ctx.params.profile.simulation or cfg.ratings == "simulated"
    rated = items[items["item_id"].isin(set(ratings["item_id"]))]
    # The study's bipolar age item, where people were asked it, is compared with the judges'
    # age_direction beside ACRB's axes; the tests between groups and arms keep ACRB's axes
    # (the item's drift is already age_change there).
    axes = raters.rated_axes(ratings)
    tables: dict[str, pd.DataFrame] = {}
    steps = ["rater agreement", "judge vs human", "tests", "corrected rates"]
    print(f"review: {len(ratings)} ratings of {ratings['item_id'].nunique()} items by "
          f"{ratings['rater'].nunique()} raters ({origin})", file=sys.stderr)
    for step in steps:
        print(f"review: {step}", file=sys.stderr)
        if step == "rater agreement":
            tables["agreement"] = raters.rater_agreement(ratings, items, axes=axes,
                                                            n_boot=cfg.bootstrap, seed=cfg.seed)
            tables["consistency"] = raters.intra_rater_consistency(ratings, axes)
        elif step == "judge vs human":
            units = raters.judge_human_units(ratings, items, _verdicts(ctx, models, axes),
                                                axes, consensus_rule=cfg.consensus)
            # Only the random sample: the items added because the judges disagreed would make
            # the judges look worse than they are.
            units = units[units["random_sample"].astype(bool)].reset_index(drop=True)
            tables["judge_human"] = raters.judge_human_agreement(units, axes)
            misses = [raters.judge_misses(units, rule, outcome, "race", seed=cfg.seed)
                      for outcome, rule in review_outcomes(ctx.params.judge.outcomes,
                                                           axes).items()]
            tables["judge_misses"] = (pd.concat(misses, ignore_index=True) if misses
                                      else pd.DataFrame(columns=raters.MISS_COLUMNS))
        elif step == "tests":
            genders = tuple(SOURCE_DIMENSIONS["gender"])
            tables["group_tests"] = pd.concat([
                raters.group_tests(ratings, items, dimension="race",
                                      rest_of=REFERENCE_RACE, consensus_rule=cfg.consensus),
                raters.group_tests(ratings, items, dimension="gender",
                                      pair=(genders[0], genders[1]),
                                      consensus_rule=cfg.consensus),
            ], ignore_index=True)
            tables["group_means"] = raters.human_group_means(
                ratings, items, axes, dimension="race", consensus_rule=cfg.consensus)
            paired = (ratings["output"] == "feature").any()
            tables["arm_tests"] = (raters.arm_tests(ratings) if paired
                                   else pd.DataFrame(columns=raters.TEST_COLUMNS))
        else:
            tables["corrected_rates"], tables["corrected_deltas"] = _corrected(
                ctx, ratings, items, models, axes)
    write_table(out_dir / "ratings.parquet", ratings, RatingRecord)
    write_table(out_dir / "items.parquet", items, ReviewItemRecord)
    for name in TABLES:
        with atomic_path(out_dir / f"{name}.parquet") as tmp:
            tables[name].to_parquet(tmp, index=False)
    write_csv(matches, out_dir / MATCHES_FILE)
    metrics = review_metrics(tables)
    n_items, n_ratings = int(ratings["item_id"].nunique()), len(ratings)
    n_raters = int(ratings["rater"].nunique())
    # What the report says about the ratings is counted from them, never taken from params:
    # an import has its own raters per item and its own number of items.
    info: dict[str, Any] = {
            "origin": origin, "ratings_from": ratings_kind(origin),
            "simulated": cfg.ratings == "simulated", "items": n_items,
            "outputs": int(ratings[["item_id", "output"]].drop_duplicates().shape[0]),
            "ratings": n_ratings, "raters": n_raters,
            "raters_per_item": raters_per_item(ratings),
            "random_sample": int(rated["random_sample"].astype(bool).sum()),
            "repeats": int(ratings["repeat"].astype(bool).sum()),
            "consensus": cfg.consensus,
            "imported_items": len(matches),
            "matched_items": int((matches["status"] == "matched").sum()),
            "unmatched_items": int((matches["status"] != "matched").sum())}
    atomic_write_json(out_dir / "review.json", info)
    write_detailed_metrics(metrics, out_dir / "metrics.csv")
    write_headline(ctx.path(layout.REVIEW_METRICS_DIR), review_headline(tables))
    with stage_run("review", profile=ctx.profile, params_hash=ctx.params_hash, params=ctx.params,
                   simulated=simulated, extra_tags={"acrb.review_origin": origin}) as tracked:
        tracked.log_params({"review.ratings": cfg.ratings, "review.sample_size": cfg.sample_size,
                            "review.raters_per_item": cfg.raters_per_item})
        tracked.log_metrics(metrics)
        tracked.log_artifact(out_dir, "review")
    return ReviewSummary(origin=origin, items=n_items, ratings=n_ratings, raters=n_raters,
                         out_dir=out_dir, metrics=metrics)
