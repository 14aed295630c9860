"""Wall time that judges add to the analysis of one paper-scale model.

The audit of :mod:`analysis_speed` (84 sources x 50 prompts x 3 seeds = 12,600 requests), with
two judges' scores and the ensemble verdict of every non-refused request simulated (scores 1-5
with source effects, 2% abstention, 1% errors), is analysed twice:

- the seven judge outcomes through the same cluster-robust Δ table and detectable gap that the
  detectors' outcomes get (:func:`acrb.analysis.estimation.resampling.clustered_disparities`,
  :func:`acrb.analysis.estimation.power.detectable_gap`), which is what ``analyze`` adds per model
  when verdicts exist; the detectors' three outcomes are timed for comparison;
- the judge tables (:func:`acrb.analysis.agreement.judging.build_judging`: mean scores, agreement,
  abstention tests, Kruskal-Wallis/Dunn and ordinal models).

Figures are not timed here (28 more PNGs per model; see benchmarks/README.md). Usage::

    python benchmarks/judge_analysis_speed.py [--boot 2000] [--perm 2000]
        [--out benchmarks/results/judge_analysis_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from acrb.analysis.agreement.judging import build_judging
from acrb.analysis.estimation.power import detectable_gap
from acrb.analysis.estimation.resampling import clustered_disparities
from acrb.analysis.outcomes import JUDGE_OUTCOMES
from acrb.config import AnalyzeParams
from acrb.records import SCORE_AXES
from analysis_speed import simulate_audit


def add_judges(frame: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The frame with verdict columns, and two judges' score tables."""
    rng = np.random.default_rng(seed)
    judged = ~frame["hard_refusal"].astype(bool).to_numpy()
    sources = frame["source_id"].to_numpy()
    codes = pd.factorize(sources)[0]
    effect = rng.normal(0, 0.6, codes.max() + 1)[codes]
    base = np.clip(np.round(3.5 + effect + rng.normal(0, 0.8, len(frame))), 1, 5)
    scores = {}
    for judge in ("g", "o"):
        noisy = np.clip(base + rng.integers(-1, 2, len(frame)), 1, 5)
        status = np.where(judged, "scored", "not_judged").astype(object)
        draw = rng.random(len(frame))
        status[judged & (draw < 0.02)] = "abstained"
        status[judged & (draw > 0.99)] = "error"
        table = pd.DataFrame({"request_id": frame["request_id"], "status": status})
        for axis in SCORE_AXES:
            values = noisy if axis != "cue_retention" else (noisy >= 3).astype(float)
            table[axis] = np.where(status == "scored", values, np.nan)
        scores[judge] = table
    out = frame.copy()
    for axis in SCORE_AXES:
        values = base if axis != "cue_retention" else (base >= 3).astype(float)
        out[axis] = np.where(judged, values, np.nan)
    for outcome, (axis, bound) in zip(JUDGE_OUTCOMES, [("edit_success", 2), ("skin_tone", 4),
                                                        ("skin_tone", 2), ("race_change", 3),
                                                        ("gender_change", 3),
                                                        ("age_change", 3),
                                                        ("cue_retention", 0.5)], strict=True):
        hit = out[axis] >= bound if outcome != "soft_erasure" else out[axis] <= bound
        out[outcome] = pd.array(np.where(judged, hit, False), dtype="boolean")
        out.loc[~judged, outcome] = pd.NA
    out["verdict_status"] = np.where(judged, "scored", "not_judged")
    out["judge_needs_review"] = pd.array(judged & (rng.random(len(frame)) < 0.1),
                                         dtype="boolean")
    return out, scores


def time_disparities(frame: pd.DataFrame, outcomes: tuple[str, ...], cfg: AnalyzeParams,
                     ) -> float:
    tick = time.perf_counter()
    for outcome in outcomes:
        table = clustered_disparities(frame, outcome, n_boot=cfg.bootstrap,
                                      n_perm=cfg.permutations)
        [detectable_gap(frame if row.category == "all"
                        else frame.loc[frame["category"] == row.category],
                        outcome, row.dimension, cfg.alpha, cfg.power)
         for row in table.itertuples(index=False)]
    return time.perf_counter() - tick


def measure(n_boot: int, n_perm: int) -> dict[str, object]:
    cfg = AnalyzeParams(bootstrap=n_boot, permutations=n_perm)
    frame, scores = add_judges(simulate_audit("race-biased", seed=101), seed=7)
    detectors = time_disparities(frame, ("hard_refusal", "erasure", "lightening"), cfg)
    judge_outcomes = time_disparities(frame, JUDGE_OUTCOMES, cfg)
    tick = time.perf_counter()
    tables = build_judging(frame, scores, n_boot=n_boot, n_perm=n_perm)
    judge_tables = time.perf_counter() - tick
    return {
        "requests": len(frame),
        "n_boot": n_boot,
        "n_perm": n_perm,
        "detector_outcomes_disparity_seconds": detectors,
        "judge_outcomes_disparity_seconds": judge_outcomes,
        "judge_tables_seconds": judge_tables,
        "score_tests": len(tables.tests),
        "agreement_rows": len(tables.agreement),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--perm", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = json.dumps(measure(args.boot, args.perm), indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
