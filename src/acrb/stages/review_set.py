"""Stage `review_set`: the judged outputs people rate, as a versioned review set.

Two parts, told apart by ``random_sample``:

- **the random sample** (``review.sample_size`` items, seed ``review.seed``): a stratified
  sample of the judged I2I outputs (verdict status ``scored``, plain arm) of every model with
  verdicts. Strata are model x race x gender x age; each gets its proportional share (largest
  remainders, ties broken at random). Inside a stratum the items are drawn systematically from
  a list ordered by prompt (the prompt order rotated by a random offset per stratum), with a
  random start: every item of a stratum has the same chance, and the draws spread over the
  prompts. When the sample is at least as large as the prompt count and a prompt is still
  missing, a drawn item whose prompt is drawn more than once is swapped for an item of the
  missing prompt in the same stratum (the stratum counts stay exact). Only these items enter
  the judge-corrected estimates of the ``review`` stage.
- or, with ``review.items: feature-pairs``, **the feature pairs**: every judged output whose
  feature-arm twin was judged too, the pairs the plan drew (the seed study's people rated its
  500 feature pairs); ``random_sample`` True, since the feature arm's cells are a stratified
  random draw of the audit;
- **the judges' disagreements**: with ``review.include_needs_review``, every judged output whose
  verdict says ``needs_review`` (the two judges differed by more than one step) is added,
  ``random_sample`` False (they are chosen by the judges' scores, so they are not a random
  draw).

When the plan has a ``feature`` arm, each item carries the same request's feature-arm output
as its pair (same model, source, prompt and seed), and raters see both side by side.

Writes ``data/review/set/items.parquet`` (:class:`~acrb.records.ReviewItemRecord` rows) and
``data/review/set/summary.json`` (sizes, the strata and prompts covered, the set's sha256).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acrb import layout
from acrb.errors import InputDataError
from acrb.records import (
    GenerationRecord,
    RequestRecord,
    ReviewItemRecord,
    VerdictRecord,
    read_table,
    write_table,
)
from acrb.stages.context import StageContext
from acrb.storage import atomic_write_json, content_hash, remove_stale_temporaries, sha256_file
from acrb.stratified import allocate, unit_key
from acrb.tracking import stage_run

#: The arm whose outputs are rated; a ``feature`` arm output is shown beside its plain twin.
PLAIN_ARM = "none"
FEATURE_ARM = "feature"
STRATA = ("model", "race", "gender", "age")


@dataclass(frozen=True)
class ReviewSetSummary:
    items: int
    random_sample: int
    needs_review_only: int
    prompts_covered: int
    prompts: int
    path: Path


def _systematic(items: pd.DataFrame, k: int, seed: int, stratum: tuple[Any, ...],
                prompt_rank: dict[str, int]) -> pd.DataFrame:
    """``k`` items of one stratum: a systematic draw over the items ordered by rotated prompt
    rank, then by a random key, from a random start (equal chance for every item)."""
    if k <= 0:
        return items.iloc[0:0]
    prompts = len(prompt_rank)
    offset = int(unit_key(seed, "offset", *stratum) * prompts)
    order = items.assign(
        _rank=[(prompt_rank[p] + offset) % prompts for p in items["prompt_id"]],
        _key=[unit_key(seed, "item", r) for r in items["request_id"]],
    ).sort_values(["_rank", "_key"])
    step = len(order) / k
    start = unit_key(seed, "start", *stratum) * step
    positions = np.floor(start + step * np.arange(k)).astype(int)
    return order.iloc[positions].drop(columns=["_rank", "_key"])


def _cover_prompts(sample: pd.DataFrame, eligible: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Swap drawn items for items of prompts the draw missed, inside the same stratum, taking
    the swapped-out item from a prompt drawn more than once (stratum counts unchanged)."""
    missing = sorted(set(eligible["prompt_id"]) - set(sample["prompt_id"]))
    if not missing:
        return sample
    sample = sample.copy()
    for prompt in missing:
        counts = sample["prompt_id"].value_counts()
        candidates = eligible[(eligible["prompt_id"] == prompt)
                              & ~eligible["request_id"].isin(sample["request_id"])]
        # The first candidate (in a seeded order) whose stratum has an output of a prompt drawn
        # more than once to give up; a prompt with no such candidate stays uncovered (the
        # summary's prompts_covered says so).
        for _, row in candidates.assign(
                _key=[unit_key(seed, "cover", r) for r in candidates["request_id"]]
        ).sort_values("_key").iterrows():
            same = sample[(sample[list(STRATA)] == row[list(STRATA)]).all(axis=1)
                          & sample["prompt_id"].map(counts).gt(1)]
            if same.empty:
                continue
            out = same.assign(_key=[unit_key(seed, "out", r) for r in same["request_id"]]
                              ).sort_values("_key").index[0]
            sample = pd.concat([sample.drop(index=out), row.drop(labels="_key").to_frame().T])
            break
    return sample


def stratified_sample(eligible: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """The random part of the review set (see the module docstring); ``eligible`` has one row
    per judged output with ``request_id``, ``prompt_id`` and the :data:`STRATA` columns."""
    if n <= 0 or eligible.empty:
        return eligible.iloc[0:0]
    prompt_rank = {p: i for i, p in enumerate(sorted(eligible["prompt_id"].unique()))}
    groups = eligible.groupby(list(STRATA), sort=True)
    shares = allocate(groups.size(), n, seed).to_dict()
    parts = [_systematic(frame, int(shares[key]), seed, tuple(key), prompt_rank)
             for key, frame in groups]
    sample = pd.concat(parts)
    if len(sample) >= len(prompt_rank):
        sample = _cover_prompts(sample, eligible, seed)
    return sample.reset_index(drop=True)


def feature_pairs(plain: pd.DataFrame, twins: pd.DataFrame) -> pd.DataFrame:
    """The plain outputs whose feature-arm twin (same model, source, prompt and seed) was also
    judged: the pairs the plan's feature arm drew (a stratified random draw of the audit's
    cells, so a random sample of them). A pair where either output was refused or not scored
    has no two images to show and is left out; the summary counts the pairs kept."""
    if plain.empty or twins.empty:
        return plain.iloc[0:0]
    cell = ["model", "source_id", "prompt_id", "seed"]
    drawn = twins[cell].drop_duplicates()
    return plain.merge(drawn, on=cell, how="inner").reset_index(drop=True)


def _eligible(ctx: StageContext) -> pd.DataFrame:
    """Judged plain-arm I2I outputs of every model with verdicts, with what an item needs."""
    plan = read_table(ctx.path(layout.PLAN_TABLE), RequestRecord, validate=False)
    frames = []
    for model in ctx.params.models:
        verdicts_path = ctx.path(layout.verdicts_table(model))
        if not verdicts_path.is_file():
            continue
        verdicts = read_table(verdicts_path, VerdictRecord, validate=False)
        generations = read_table(ctx.path(layout.generations_table(model)), GenerationRecord,
                                 validate=False)
        # WinoBias outputs answer the role question, not the rubric people rate here.
        requests = plan[(plan["model"] == model) & (plan["mode"] == "i2i")
                        & (plan["experiment"] == "audit")]
        if requests.empty:
            continue
        merged = (requests.merge(verdicts[["request_id", "status", "needs_review"]],
                                 on="request_id")
                  .merge(generations[["request_id", "image_path"]], on="request_id"))
        merged = merged[(merged["status"] == "scored") & merged["image_path"].notna()]
        frames.append(merged)
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def _items(rows: pd.DataFrame, feature: dict[tuple[Any, ...], pd.Series], *,
           random_sample: bool) -> list[dict[str, Any]]:
    items = []
    for _, row in rows.iterrows():
        twin = feature.get((row["model"], row["source_id"], row["prompt_id"], int(row["seed"])))
        paired_id = None if twin is None else str(twin["request_id"])
        items.append(ReviewItemRecord(
            item_id=content_hash({"request": row["request_id"], "paired": paired_id}, 16),
            request_id=str(row["request_id"]), paired_request_id=paired_id,
            model=str(row["model"]), prompt_id=str(row["prompt_id"]),
            instruction=str(row["prompt_text"]), source_id=str(row["source_id"]),
            source_path=str(row["source_path"]), output_path=str(row["image_path"]),
            paired_output_path=None if twin is None else str(twin["image_path"]),
            race=str(row["race"]), gender=str(row["gender"]), age=str(row["age"]),
            random_sample=random_sample, needs_review=bool(row["needs_review"]),
        ).model_dump())
    return items


def run(ctx: StageContext) -> ReviewSetSummary:
    cfg = ctx.params.review
    eligible = _eligible(ctx)
    out = ctx.path(layout.REVIEW_SET)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Temporaries a killed run left (a rerun by command, not by DVC, keeps the folder).
    remove_stale_temporaries(out.parent)
    if eligible.empty:
        if ctx.params.judge.use:
            raise InputDataError(
                "no judged image-editing outputs to review: the judge stage wrote no verdicts "
                "with status 'scored'", "run `dvc repro` (or `acrb judge --model M`) first")
        plain = eligible
    else:
        plain = eligible[eligible["arm"] == PLAIN_ARM]
    twins = eligible[eligible["arm"] == FEATURE_ARM] if not eligible.empty else eligible
    feature = {(r["model"], r["source_id"], r["prompt_id"], int(r["seed"])): r
               for _, r in twins.iterrows()}
    if cfg.items == "feature-pairs":
        sample = feature_pairs(plain, twins)
    else:
        sample = (stratified_sample(plain, cfg.sample_size, cfg.seed) if not plain.empty
                  else plain)
        if cfg.sample_size > len(plain):
            print(f"review_set: review.sample_size is {cfg.sample_size} but only {len(plain)} "
                  "judged outputs exist; all are in the sample", file=sys.stderr)
    rows = _items(sample, feature, random_sample=True)
    extra = pd.DataFrame()
    if cfg.include_needs_review and not plain.empty:
        extra = plain[plain["needs_review"].astype(bool)
                      & ~plain["request_id"].isin(sample["request_id"])]
        rows += _items(extra, feature, random_sample=False)
    write_table(out, pd.DataFrame(rows, columns=list(ReviewItemRecord.model_fields)),
                ReviewItemRecord)
    prompts = int(plain["prompt_id"].nunique()) if not plain.empty else 0
    covered = int(sample["prompt_id"].nunique()) if not sample.empty else 0
    summary = ReviewSetSummary(items=len(rows), random_sample=len(sample),
                               needs_review_only=len(extra), prompts_covered=covered,
                               prompts=prompts, path=out)
    strata = (sample.groupby(list(STRATA)).size() if not sample.empty else pd.Series(dtype=int))
    atomic_write_json(ctx.path(layout.REVIEW_SET_SUMMARY), {
        "items": summary.items, "random_sample": summary.random_sample,
        "needs_review_only": summary.needs_review_only,
        "prompts": prompts, "prompts_covered": covered,
        "strata_sampled": int((strata > 0).sum()), "seed": cfg.seed,
        "sha256": sha256_file(out),
    })
    with stage_run("review_set", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params,
                   simulated=ctx.params.profile.simulation) as tracked:
        tracked.log_metrics({"review_set.items": summary.items,
                             "review_set.random_sample": summary.random_sample,
                             "review_set.prompts_covered": covered})
    return summary
