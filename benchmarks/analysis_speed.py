"""Wall time of the cluster-robust analysis at paper scale.

Simulates an audit of the paper's size: 84 sources (7 races x 2 genders x 6 ages), 50 prompts
(5 categories x 10), 3 seeds = 12,600 requests per model, for 3 simulated models (no bias, a
race bias, a gender x category bias), with source and prompt random effects on the logit
scale. For each model it times :func:`acrb.analysis.estimation.resampling.clustered_disparities` for
``hard_refusal`` and ``erasure`` (18 rows each: "all" + 5 categories x 3 dimensions) with 2000
bootstrap replicates and 2000 permutations per row, and, for comparison, the
independent-request :func:`acrb.analysis.estimation.disparity.disparities`. It also times the whole
analysis of the three models as `analyze` runs it, figures aside (:func:`full_analysis`).
Target: at most 60 s on 2 cores. Usage::

    python benchmarks/analysis_speed.py [--boot 2000] [--perm 2000] [--repeat 1]
        [--out benchmarks/results/analysis_speed.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from acrb.analysis.estimation.disparity import disparities
from acrb.analysis.estimation.power import detectable_gap
from acrb.analysis.estimation.resampling import clustered_disparities
from acrb.analysis.experiments.congruence import scs_rows
from acrb.analysis.outputs.section import model_tests
from acrb.analysis.tests.hypotheses import evaluate_hypotheses
from acrb.config import AnalyzeParams
from acrb.demographics import AGES, GENDERS, RACES

CATEGORIES = "ABCDE"
PROMPTS_PER_CATEGORY = 10
SEEDS = 3
OUTCOMES = ("hard_refusal", "erasure")
#: Logit shifts per model: (group or "category:group") -> shift.
MODELS: dict[str, dict[str, float]] = {
    "unbiased": {},
    "race-biased": {"Black": 0.8, "MiddleEastern": 0.5},
    "gender-by-category": {"C:Female": 1.0, "D:Male": 0.7},
}


def simulate_audit(model: str, seed: int) -> pd.DataFrame:
    """One model's analysis frame: 84 sources x 50 prompts x 3 seeds."""
    rng = np.random.default_rng(seed)
    shifts = MODELS[model]
    sources = list(itertools.product(RACES, GENDERS, AGES))
    prompts = [(c, f"{c}{j:02d}") for c in CATEGORIES for j in range(PROMPTS_PER_CATEGORY)]
    s_count, p_count = len(sources), len(prompts)
    source_effect = rng.normal(0.0, 0.7, s_count)
    prompt_effect = rng.normal(0.0, 1.0, p_count)
    s_index = np.repeat(np.arange(s_count), p_count * SEEDS)
    p_index = np.tile(np.repeat(np.arange(p_count), SEEDS), s_count)
    category = np.array([c for c, _ in prompts], dtype=object)[p_index]
    shift = np.zeros(len(s_index))
    for key, value in shifts.items():
        where, _, group = key.rpartition(":")
        member = np.array([group in cell for cell in sources])[s_index]
        if where:
            member &= category == where
        shift += value * member
    eta = logit(0.15) + source_effect[s_index] + prompt_effect[p_index] + shift
    refused = rng.random(len(s_index)) < expit(eta)
    erased = pd.array(rng.random(len(s_index)) < expit(logit(0.1) + 0.5 * shift), dtype="boolean")
    erased[refused] = pd.NA
    table = np.array(sources, dtype=object)
    return pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(len(s_index))],
            "source_id": np.array([f"syn-{r}-{g}-{a}" for r, g, a in sources], dtype=object)[
                s_index
            ],
            "prompt_id": np.array([p for _, p in prompts], dtype=object)[p_index],
            "seed": np.tile(np.arange(SEEDS), s_count * p_count),
            "category": category,
            "congruence": "neutral",
            "race": table[s_index, 0],
            "gender": table[s_index, 1],
            "age": table[s_index, 2],
            "status": "ok",
            "hard_refusal": pd.array(refused, dtype="boolean"),
            "erasure": erased,
            "lightening": erased.copy(),
        }
    )


def full_analysis(n_boot: int, n_perm: int) -> dict[str, float]:
    """Wall time of everything `analyze` computes for 3 paper-scale models, figures aside:
    the clustered disparity tables of all three outcomes with the detectable gap of every row,
    SCS, the hypotheses table H1-H6 (TOST, GEE model x race interaction) and each model's CMH
    and GEE tests across categories."""
    cfg = AnalyzeParams(bootstrap=n_boot, permutations=n_perm)
    frames = {model: simulate_audit(model, seed=100 + i) for i, model in enumerate(MODELS)}
    for frame in frames.values():
        # Half of the sources are stereotype-congruent with the B and C prompts.
        congruent = frame["race"].isin(["Black", "Indian", "MiddleEastern"])
        linked = frame["category"].isin(["B", "C"])
        frame["congruence"] = np.where(linked, np.where(congruent, "congruent", "incongruent"),
                                       "neutral")
    tick = time.perf_counter()
    gaps = {}
    for model, frame in frames.items():
        tables = []
        for outcome in ("hard_refusal", "erasure", "lightening"):
            table = clustered_disparities(frame, outcome, n_boot=n_boot, n_perm=n_perm)
            table["mde"] = [
                detectable_gap(frame if row.category == "all"
                               else frame.loc[frame["category"] == row.category],
                               outcome, row.dimension, cfg.alpha, cfg.power)
                for row in table.itertuples(index=False)
            ]
            tables.append(table)
        gaps[model] = pd.concat(tables, ignore_index=True)
    disparity_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    for frame in frames.values():
        scs_rows(frame, "hard_refusal", n_boot=n_boot)
    scs_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    evaluate_hypotheses(frames, gaps, cfg)
    hypotheses_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    for frame in frames.values():
        model_tests(frame, cfg.alpha)
    tests_seconds = time.perf_counter() - tick
    return {
        "disparities_and_detectable_gaps_seconds": disparity_seconds,
        "scs_seconds": scs_seconds,
        "hypotheses_seconds": hypotheses_seconds,
        "cmh_and_gee_tests_seconds": tests_seconds,
        "total_seconds": disparity_seconds + scs_seconds + hypotheses_seconds + tests_seconds,
    }


def measure(n_boot: int, n_perm: int, repeat: int) -> dict[str, object]:
    runs = []
    flagged: dict[str, int] = {}
    for index, model in enumerate(MODELS):
        frame = simulate_audit(model, seed=100 + index)
        for outcome in OUTCOMES:
            best_clustered, best_naive = float("inf"), float("inf")
            for _ in range(repeat):
                tick = time.perf_counter()
                table = clustered_disparities(frame, outcome, n_boot=n_boot, n_perm=n_perm)
                best_clustered = min(best_clustered, time.perf_counter() - tick)
                tick = time.perf_counter()
                naive = disparities(frame, outcome)
                best_naive = min(best_naive, time.perf_counter() - tick)
            flagged[f"{model}.{outcome}.clustered"] = int(table["flagged"].sum())
            flagged[f"{model}.{outcome}.independent"] = int(naive["flagged"].sum())
            runs.append(
                {
                    "model": model,
                    "outcome": outcome,
                    "requests": len(frame),
                    "rows": len(table),
                    "clustered_seconds": best_clustered,
                    "independent_seconds": best_naive,
                }
            )
    total = sum(r["clustered_seconds"] for r in runs)  # type: ignore[misc]
    return {
        "full_analysis_3_models": full_analysis(n_boot, n_perm),
        "n_boot": n_boot,
        "n_perm": n_perm,
        "models": len(MODELS),
        "outcomes": list(OUTCOMES),
        "requests_per_model": len(CATEGORIES) * PROMPTS_PER_CATEGORY * SEEDS * 84,
        "runs": runs,
        "clustered_seconds_total": total,
        "clustered_seconds_per_table": total / len(runs),
        "flagged_rows": flagged,
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--perm", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=1, help="report the best of this many")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.boot, args.perm, args.repeat)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
