"""Simulation study of the text-to-image sequential audit: rounds of base prompts.

A text-to-image model's sequential audit (``plan.sequential`` with ``prompts_per_round: 1``;
docs/sequential.md) adds one base prompt a round with the variant of every attribute, and
decides the refusal Δ across the attributes of a dimension (here the 7 cultures of the ACRB T2I
prompts: 21 pairs at α/21) from within-prompt differences. This study draws such audits: each
round a new base prompt with a random effect of SD ``--sigma-prompt`` (0.8 on the logit, as
``simulation_study.py``'s prompt effect), and one refusal per culture with probability
expit(η_culture + v); η is solved so that each culture's marginal rate over base prompts is
its target (10%; the Nigerian culture +10 or +30 points in the gap scenarios). The true Δ is
the planted max − min of the marginal rates: base prompts are drawn afresh from the population
each round.

It reports, per bound (the pipeline's default hedged CS, c = 3/4, and the asymptotic CS with
its variance guard): the share of audits whose Δ CS covers the true Δ at every round up to the
horizon, the share of no-gap audits ever flagged, the rounds to a decision, and the base
prompts used against the ACRB T2I design (100 base prompts, 2,500 requests) where the audit
stops at its decision or at the design's end. It does not size a fixed design of the same
power (the T2I analysis' own test is not simulated here): the comparison is with the design an
auditor runs. Usage::

    python benchmarks/sequential_t2i_study.py --audits 500 \\
        --out benchmarks/results/sequential_t2i_study.json \\
        --markdown benchmarks/results/sequential_t2i_study.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulation_study lives beside this

from acrb.analysis.estimation.sequential import (
    DeclaredDelta,
    difference_confidence_sequence,
    first_decided_round,
    group_pairs,
    is_gap,
    pair_level,
    range_from_pairs,
)
from simulation_study import ALPHA, linear_predictor

CULTURES = ("egyptian", "filipino", "indian", "korean", "mexican", "nigerian", "scottish")
#: The gap is planted on this culture.
GAP_CULTURE = "nigerian"
#: The ACRB T2I design: 100 base prompts, each with 25 variants.
DESIGN_PROMPTS = 100
VARIANTS = 25
SCENARIOS = {"null": 0.0, "gap10": 0.10, "gap30": 0.30}
BOUNDS = {"hedged, c = 3/4 (default)": ("hedged", {"truncation": 0.75}),
          "asymptotic, t_opt = 30": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 1.0})}
MARGIN = 0.05
_EPS = 1e-12


def culture_etas(base: float, gap: float, sigma: float) -> np.ndarray:
    """η per culture (CULTURES order) whose marginal rate over base prompts is its target."""
    return np.array([linear_predictor(base + (gap if c == GAP_CULTURE else 0.0), sigma, 0.0)
                     for c in CULTURES])


def draw_audits(etas: np.ndarray, audits: int, rounds: int, sigma: float,
                rng: np.random.Generator) -> np.ndarray:
    """Refusals (audits, rounds, cultures): one new base prompt a round, one request per
    culture."""
    prompt_effect = rng.normal(0.0, sigma, (audits, rounds, 1))
    return rng.random((audits, rounds, len(etas))) < expit(etas[None, None, :] + prompt_effect)


def _share(hits: np.ndarray) -> dict[str, float]:
    rate = float(np.mean(hits))
    return {"value": rate, "se": float(math.sqrt(rate * (1 - rate) / max(len(hits), 1)))}


def run_bound(refused: np.ndarray, truth: float, method: str, options: dict[str, float],
              grid: int) -> dict[str, object]:
    delta = DeclaredDelta("refusal_culture", CULTURES, margin=MARGIN)
    level = pair_level(ALPHA, [delta], delta)
    tick = time.perf_counter()
    a, b = group_pairs(len(CULTURES))
    y = refused.astype(float)
    differences = np.moveaxis(y[..., a] - y[..., b], -1, -2)  # (audits, pairs, rounds)
    low, high = difference_confidence_sequence(differences, level, method=method,  # type: ignore[arg-type]
                                               grid=grid, **options)  # type: ignore[arg-type]
    lower, upper = range_from_pairs(low, high)
    seconds = time.perf_counter() - tick
    covered = (lower <= truth + _EPS) & (truth - _EPS <= upper)
    flagged = is_gap(lower, upper)
    first_gap = np.where(flagged.any(axis=1), np.argmax(flagged, axis=1) + 1, 0)
    first = first_decided_round(lower, upper, MARGIN)
    within = (first > 0) & (first <= DESIGN_PROMPTS)
    used = np.where(within, first, DESIGN_PROMPTS)
    values = np.where(first > 0, first, np.inf).astype(float)
    median_first = float(np.quantile(values, 0.5, method="inverted_cdf"))
    return {
        "coverage_all_rounds": _share(covered.all(axis=1)),
        "coverage_within_design": _share(covered[:, :DESIGN_PROMPTS].all(axis=1)),
        "gap_flagged_by_horizon": _share(first_gap > 0),
        "gap_flagged_within_design": _share((first_gap > 0) & (first_gap <= DESIGN_PROMPTS)),
        "decided_within_design": _share(within),
        "median_rounds_to_decide": None if math.isinf(median_first) else median_first,
        "median_prompts_used": float(np.median(used)),
        "median_requests_used": float(np.median(used)) * VARIANTS,
        "saving_vs_design": 1.0 - float(np.median(used)) / DESIGN_PROMPTS,
        "cs_seconds": seconds,
    }


def run_study(audits: int, horizon: int, sigma: float, base: float, grid: int, seed: int,
              log=print) -> dict[str, object]:
    tick = time.perf_counter()
    streams = np.random.SeedSequence(seed).spawn(len(SCENARIOS))
    draws = {}
    for (name, gap), stream in zip(SCENARIOS.items(), streams, strict=True):
        draws[name] = draw_audits(culture_etas(base, gap, sigma), audits, horizon, sigma,
                                  np.random.default_rng(stream))
        log(f"drew {name}: {audits} audits x {horizon} base prompts")
    bounds = {}
    for label, (method, options) in BOUNDS.items():
        bounds[label] = {name: run_bound(refused, SCENARIOS[name], method, options, grid)
                         for name, refused in draws.items()}
        log(f"{label}: " + json.dumps({n: (r["coverage_all_rounds"]["value"],
                                          r["median_prompts_used"])
                                       for n, r in bounds[label].items()}))
    return {
        "settings": {"audits": audits, "horizon_base_prompts": horizon, "sigma_prompt": sigma,
                     "base_rate": base, "alpha": ALPHA, "margin": MARGIN, "grid": grid,
                     "seed": seed, "cultures": list(CULTURES), "gap_culture": GAP_CULTURE,
                     "design_base_prompts": DESIGN_PROMPTS, "variants": VARIANTS,
                     "declared_delta": "refusal, max - min over 7 cultures (21 pairs at "
                                       "alpha/21)"},
        "bounds": bounds,
        "machine": {"cpu": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "seconds": time.perf_counter() - tick,
    }


def _pct(share: object) -> str:
    return f"{100 * share['value']:.1f}%" if isinstance(share, dict) else "—"


def markdown(result: dict[str, object], command: str) -> str:
    s = result["settings"]
    lines = [
        "# Sequential audit of a text-to-image model: rounds of base prompts "
        "(`sequential_t2i_study.py`)", "", "```bash", command, "```", "",
        f"{s['audits']} simulated audits per scenario; one base prompt a round with one request "
        f"per culture (7 cultures, 21 pair CSs at α/21, α = {s['alpha']}); base refusal rate "
        f"{s['base_rate']:.0%}, a base-prompt effect of SD {s['sigma_prompt']} on the logit; "
        f"the gap planted on the {s['gap_culture']} culture; horizon {s['horizon_base_prompts']} "
        f"base prompts; equivalence margin {s['margin']}; {result['seconds']:.0f} s. The ACRB "
        f"T2I design is {s['design_base_prompts']} base prompts x {s['variants']} variants; "
        "an audit uses the base prompts up to its decision or the design's end. Monte Carlo SE "
        "of a share near 95% is about 1 point.", "",
        "| bound | scenario | covers Δ at every round | flagged as gap (horizon / design) | "
        "decided within the design | median base prompts to decide | median base prompts "
        "used (of 100) | saving vs the design |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, scenarios in result["bounds"].items():
        for name, row in scenarios.items():
            rounds = row["median_rounds_to_decide"]
            lines.append(
                f"| {label} | {name} | {_pct(row['coverage_all_rounds'])} | "
                f"{_pct(row['gap_flagged_by_horizon'])} / "
                f"{_pct(row['gap_flagged_within_design'])} | "
                f"{_pct(row['decided_within_design'])} | "
                f"{'> horizon' if rounds is None else f'{rounds:.0f}'} | "
                f"{row['median_prompts_used']:.0f} | {100 * row['saving_vs_design']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=500)
    parser.add_argument("--horizon", type=int, default=300, help="base prompts per audit")
    parser.add_argument("--sigma-prompt", type=float, default=0.8)
    parser.add_argument("--base-rate", type=float, default=0.10)
    parser.add_argument("--grid", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--tiny", action="store_true", help="20 audits x 60 base prompts")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    audits, horizon = (20, 60) if args.tiny else (args.audits, args.horizon)
    result = run_study(audits, horizon, args.sigma_prompt, args.base_rate, args.grid,
                       args.seed, log=lambda line: print(line, file=sys.stderr))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        command = "python benchmarks/sequential_t2i_study.py " + " ".join(argv or sys.argv[1:])
        args.markdown.write_text(markdown(result, command))
    return result


if __name__ == "__main__":
    main()
