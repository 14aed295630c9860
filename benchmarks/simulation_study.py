"""Simulation study: does ACRB's disparity method do what it claims, and does the naive one?

Simulates many audits of one prompt category at the seed study's design (84 sources = 7 races
x 2 genders x 6 ages, 10 prompts, one seed: 840 requests) with requests clustered the way real
audits are: each source image and each prompt carries its own random effect on the logit of
the refusal probability (a face that a filter dislikes is refused for most prompts; a prompt
that trips the filter is refused for most faces). For each simulated audit it runs

- ACRB's method: two-way cluster bootstrap Δ interval (sources and prompts resampled),
  permutation test of group labels over sources;
- the naive method that published audits use: Pearson chi-square of refusal x race over
  requests treated as independent, and Newcombe/Wald intervals that ignore clustering;

and reports (a) the false-positive rate of each test with no planted bias, (b) how often the
95% intervals for each group's rate R(a) and for Δ cover the planted values, (c) the power to
detect a planted 10 pp gap, against the minimum detectable gap that the report predicts for
this design. Usage::

    python benchmarks/simulation_study.py --audits 500 \
        --out benchmarks/results/simulation_study.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import chi2_contingency
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from acrb.analysis.disparity import delta_interval
from acrb.analysis.power import design_effect, minimum_detectable_gap
from acrb.analysis.rates import wilson_interval
from acrb.analysis.resampling import (
    delta_bootstrap,
    delta_permutation_p,
    prepare_block,
    rate_bootstrap,
)
from acrb.demographics import AGES, GENDERS, RACES

PROMPTS = 10
ALPHA = 0.05
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Scenario:
    name: str
    base_rate: float
    #: Planted change of the marginal refusal rate per race (rate units), before clustering.
    race_gaps: dict[str, float]
    sigma_source: float
    sigma_prompt: float


def _gauss_hermite(sigma: float, points: int = 40) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)
    return nodes * sigma, weights / weights.sum()


def marginal_rate(eta: float, sigma_source: float, sigma_prompt: float) -> float:
    """E[expit(eta + u + v)] for independent normal source and prompt effects (quadrature)."""
    u, wu = _gauss_hermite(sigma_source)
    v, wv = _gauss_hermite(sigma_prompt)
    return float(np.sum(wu[:, None] * wv[None, :] * expit(eta + u[:, None] + v[None, :])))


def linear_predictor(target: float, sigma_source: float, sigma_prompt: float) -> float:
    """The eta whose marginal rate is ``target`` (bisection on the monotone marginal)."""
    low, high = -15.0, 15.0
    for _ in range(80):
        middle = (low + high) / 2
        if marginal_rate(middle, sigma_source, sigma_prompt) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def design() -> pd.DataFrame:
    cells = [(r, g, a) for r in RACES for g in GENDERS for a in AGES]
    sources = pd.DataFrame(cells, columns=["race", "gender", "age"])
    sources["source_id"] = [f"s{i:03d}" for i in range(len(sources))]
    prompts = pd.DataFrame({"prompt_id": [f"p{j:02d}" for j in range(PROMPTS)]})
    frame = sources.merge(prompts, how="cross")
    frame["request_id"] = frame["source_id"] + "-" + frame["prompt_id"]
    frame["category"] = "A"
    frame["congruence"] = "neutral"
    frame["seed"] = 0
    frame["status"] = "ok"
    return frame


def simulate(frame: pd.DataFrame, scenario: Scenario, etas: dict[str, float],
             rng: np.random.Generator) -> pd.DataFrame:
    sources = frame["source_id"].unique()
    prompts = frame["prompt_id"].unique()
    u = dict(zip(sources, rng.normal(0, scenario.sigma_source, len(sources)), strict=True))
    v = dict(zip(prompts, rng.normal(0, scenario.sigma_prompt, len(prompts)), strict=True))
    eta = (frame["race"].map(etas) + frame["source_id"].map(u) + frame["prompt_id"].map(v))
    refused = rng.random(len(frame)) < expit(eta.to_numpy())
    out = frame.copy()
    out["hard_refusal"] = pd.array(refused, dtype="boolean")
    out["erasure"] = pd.array([pd.NA] * len(out), dtype="boolean")
    out["lightening"] = pd.array([pd.NA] * len(out), dtype="boolean")
    return out


def naive(frame: pd.DataFrame) -> dict[str, object]:
    """Requests as independent: Pearson chi-square, Wilson rates, Newcombe Δ interval."""
    counts = frame.groupby("race", observed=True)["hard_refusal"].agg(["sum", "count"])
    k = counts["sum"].to_numpy(dtype=float)
    n = counts["count"].to_numpy(dtype=float)
    table = np.stack([k, n - k], axis=1)
    p_value = 1.0 if (table.sum(axis=0) == 0).any() else float(
        chi2_contingency(table, correction=False).pvalue)
    low, high = delta_interval(k, n, CONFIDENCE)
    rate_ci = {race: wilson_interval(int(ki), int(ni), CONFIDENCE)
               for race, ki, ni in zip(counts.index, k, n, strict=True)}
    return {"p": p_value, "delta_ci": (low, high), "rate_ci": rate_ci}


def run_scenario(scenario: Scenario, audits: int, n_boot: int, n_perm: int,
                 seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    base = design()
    targets = {race: scenario.base_rate + scenario.race_gaps.get(race, 0.0) for race in RACES}
    etas = {race: linear_predictor(t, scenario.sigma_source, scenario.sigma_prompt)
            for race, t in targets.items()}
    planted_delta = max(targets.values()) - min(targets.values())
    tallies = {key: 0 for key in (
        "acrb_reject", "naive_reject", "acrb_delta_covered", "naive_delta_covered",
        "acrb_rate_covered", "naive_rate_covered", "rate_intervals")}
    deffs = []
    tick = time.perf_counter()
    for audit in range(audits):
        frame = simulate(base, scenario, etas, rng)
        block = prepare_block(frame, "hard_refusal", "race")
        boot = delta_bootstrap(block, CONFIDENCE, n_boot, seed + audit)
        p_perm = delta_permutation_p(block, n_perm, seed + audit).p_value
        tallies["acrb_reject"] += p_perm < ALPHA
        tallies["acrb_delta_covered"] += boot.ci_low <= planted_delta <= boot.ci_high
        rates = rate_bootstrap(block, CONFIDENCE, n_boot, seed + audit)
        for race, low, high in zip(rates["value"], rates["boot_low"], rates["boot_high"],
                                   strict=True):
            tallies["acrb_rate_covered"] += low <= targets[race] <= high
        simple = naive(frame)
        tallies["naive_reject"] += simple["p"] < ALPHA
        low, high = simple["delta_ci"]
        tallies["naive_delta_covered"] += low <= planted_delta <= high
        for race, (low, high) in simple["rate_ci"].items():
            tallies["naive_rate_covered"] += low <= targets[race] <= high
        tallies["rate_intervals"] += len(RACES)
        deffs.append(design_effect(frame, "hard_refusal", "race").deff)
    seconds = time.perf_counter() - tick
    deff = float(np.mean(deffs))
    mde = minimum_detectable_gap(
        n_sources_per_group=len(GENDERS) * len(AGES), requests_per_source=PROMPTS,
        base_rate=scenario.base_rate, alpha=ALPHA, power=0.8, n_groups=len(RACES), deff=deff,
    )
    predicted = predicted_power(
        scenario, n_sources_per_group=len(GENDERS) * len(AGES), deff=deff)
    result = {
        "scenario": scenario.name,
        "audits": audits,
        "base_rate": scenario.base_rate,
        "planted_delta": planted_delta,
        "sigma_source": scenario.sigma_source,
        "sigma_prompt": scenario.sigma_prompt,
        "acrb_rejection_rate": tallies["acrb_reject"] / audits,
        "naive_rejection_rate": tallies["naive_reject"] / audits,
        "acrb_delta_coverage": tallies["acrb_delta_covered"] / audits,
        "naive_delta_coverage": tallies["naive_delta_covered"] / audits,
        "acrb_rate_coverage": tallies["acrb_rate_covered"] / tallies["rate_intervals"],
        "naive_rate_coverage": tallies["naive_rate_covered"] / tallies["rate_intervals"],
        "mean_design_effect": deff,
        "predicted_minimum_detectable_gap": mde,
        "predicted_power_at_planted_gap": predicted,
        "seconds": seconds,
    }
    return result


def predicted_power(scenario: Scenario, n_sources_per_group: int, deff: float) -> float:
    """Power that the report's power model (item 6) predicts for the planted gap: a two-sided
    two-proportion test at the Bonferroni level over all pairs of races, effective n divided
    by the design effect. NaN without a planted gap."""
    if not scenario.race_gaps:
        return float("nan")
    high = scenario.base_rate + max(scenario.race_gaps.values())
    effect = proportion_effectsize(high, scenario.base_rate)
    pairs = len(RACES) * (len(RACES) - 1) // 2
    n_effective = n_sources_per_group * PROMPTS / deff
    return float(NormalIndPower().power(effect_size=effect, nobs1=n_effective,
                                        alpha=ALPHA / pairs, ratio=1.0))


SCENARIOS = {
    "null": Scenario("null: no planted bias", 0.10, {}, 0.8, 0.8),
    "gap10": Scenario("planted 10 pp gap (Black +10 pp)", 0.10, {"Black": 0.10}, 0.8, 0.8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=500)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--permutations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), nargs="+",
                        default=sorted(SCENARIOS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for index, name in enumerate(args.scenario):
        row = run_scenario(SCENARIOS[name], args.audits, args.bootstrap, args.permutations,
                           args.seed + 1_000_003 * index)
        print(json.dumps(row))
        results.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": {"cpu": platform.machine(), "cpus": os.cpu_count(),
                               "python": platform.python_version()},
                   "results": results}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
