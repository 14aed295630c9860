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

The ``designs`` mode measures the default Δ interval (test inversion, :func:`delta_inversion`),
the bias-corrected Δ and the row tests at half, the study's and double the sources per race,
under no gap, a small planted gap and a large one (:func:`run_design_cell`)::

    python benchmarks/simulation_study.py designs --audits 200 \
        --out benchmarks/results/simulation_study_designs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import chi2_contingency, f_oneway
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import proportion_effectsize

from acrb.analysis.estimation.disparity import delta_interval
from acrb.analysis.estimation.power import design_effect, minimum_detectable_gap
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.estimation.resampling import (
    delta_bootstrap,
    delta_inversion,
    delta_permutation_p,
    group_test_p,
    prepare_block,
    rate_bootstrap,
    rate_intervals,
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
    #: Effect of the other source dimensions on the logit (designs mode): age from −s to +s
    #: across the design's ages, gender ±s/2. The race targets stay the marginal rates.
    strata_effect: float = 0.0


def strata_offsets(frame: pd.DataFrame, effect: float) -> np.ndarray:
    """Per row of ``frame``, the logit offset of its source's gender and age (see
    :attr:`Scenario.strata_effect`): 0 everywhere when ``effect`` is 0."""
    ages = list(dict.fromkeys(frame["age"]))
    position = frame["age"].map({age: i for i, age in enumerate(ages)}).to_numpy(dtype=float)
    spread = max(len(ages) - 1, 1)
    age_term = effect * (2 * position / spread - 1) if len(ages) > 1 else 0 * position
    first = frame["gender"].iloc[0]
    gender_term = np.where(frame["gender"].to_numpy() == first, effect / 2, -effect / 2)
    return age_term + gender_term


def _gauss_hermite(sigma: float, points: int = 40) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)
    return nodes * sigma, weights / weights.sum()


def marginal_rate(eta: float, sigma_source: float, sigma_prompt: float) -> float:
    """E[expit(eta + u + v)] for independent normal source and prompt effects (quadrature)."""
    u, wu = _gauss_hermite(sigma_source)
    v, wv = _gauss_hermite(sigma_prompt)
    return float(np.sum(wu[:, None] * wv[None, :] * expit(eta + u[:, None] + v[None, :])))


def linear_predictor(target: float, sigma_source: float, sigma_prompt: float,
                     offsets: np.ndarray | None = None) -> float:
    """The eta whose marginal rate is ``target`` (bisection on the monotone marginal); with
    ``offsets`` (one per source cell, equally weighted) the rate averaged over them."""
    cells = np.unique(offsets) if offsets is not None else np.zeros(1)
    weights = (np.array([np.mean(offsets == c) for c in cells]) if offsets is not None
               else np.ones(1))

    def rate(eta: float) -> float:
        return float(sum(w * marginal_rate(eta + c, sigma_source, sigma_prompt)
                         for c, w in zip(cells, weights, strict=True)))

    low, high = -15.0, 15.0
    for _ in range(80):
        middle = (low + high) / 2
        if rate(middle) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def design(ages: tuple[str, ...] = AGES) -> pd.DataFrame:
    """Every source (race x gender x age, one per entry of ``ages``, which may repeat a label)
    crossed with every prompt."""
    cells = [(r, g, a) for r in RACES for g in GENDERS for a in ages]
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


# --------------------------------------------------------------------------------------------
# Designs mode: the default Δ interval, the corrected Δ and the row tests at three designs

#: Ages per gender of each design (a label may repeat; every source has its own id), so half
#: has 6 sources per race, the study 12 and double 24.
DESIGNS: dict[str, tuple[str, ...]] = {
    "half": AGES[:3],
    "study": AGES,
    "double": tuple(age for age in AGES for _ in range(2)),
}
DESIGN_SCENARIOS = {
    "null": Scenario("Δ = 0: base rate 10% for every race", 0.10, {}, 0.8, 0.8),
    "gap6": Scenario("small gap: Black and White +6 pp", 0.10,
                     {"Black": 0.06, "White": 0.06}, 0.8, 0.8),
    "gap14.7": Scenario("large gap: Black and White +14.7 pp", 0.10,
                        {"Black": 0.147, "White": 0.147}, 0.8, 0.8),
    # Gender and age move the rate too (age −1 to +1 on the logit, gender ±0.5), as they do
    # in real audits; the race targets stay the marginal rates.
    "null-strata": Scenario("Δ = 0, gender and age effects", 0.10, {}, 0.8, 0.8, 1.0),
    "gap14.7-strata": Scenario("large gap, gender and age effects", 0.10,
                               {"Black": 0.147, "White": 0.147}, 0.8, 0.8, 1.0),
}
TESTS = ("between-groups", "range", "gee-score")
#: Resamples of the audits for the Monte Carlo SE of the width ratio.
_RATIO_BOOT = 2000


class _Simulator:
    """Draws audits of one design and scenario: the frame is built once and only the outcome
    column changes (the same model as :func:`simulate`, vectorised over requests)."""

    def __init__(self, frame: pd.DataFrame, scenario: Scenario, etas: dict[str, float]):
        self.scenario = scenario
        self.source_code, sources = pd.factorize(frame["source_id"])
        self.prompt_code, prompts = pd.factorize(frame["prompt_id"])
        self.n_sources, self.n_prompts = len(sources), len(prompts)
        self.eta = (frame["race"].map(etas).to_numpy(dtype=float)
                    + strata_offsets(frame, scenario.strata_effect))
        missing = pd.array([pd.NA] * len(frame), dtype="boolean")
        self.frame = frame.assign(erasure=missing, lightening=missing)

    def draw(self, rng: np.random.Generator) -> pd.DataFrame:
        u = rng.normal(0, self.scenario.sigma_source, self.n_sources)
        v = rng.normal(0, self.scenario.sigma_prompt, self.n_prompts)
        eta = self.eta + u[self.source_code] + v[self.prompt_code]
        refused = rng.random(len(eta)) < expit(eta)
        return self.frame.assign(hard_refusal=pd.array(refused, dtype="boolean"))


def _anova_p(block) -> float:
    """One-way ANOVA of the per-source refusal rates y_s/n_s across the block's groups."""
    rates = block.y.sum(axis=1) / block.n.sum(axis=1)
    samples = [rates[block.group_index == g] for g in range(len(block.groups))]
    p_value = float(f_oneway(*samples).pvalue)
    return 1.0 if np.isnan(p_value) else p_value  # no spread at all: no evidence


def _share(hits: np.ndarray) -> tuple[float, float]:
    """A proportion over audits and its binomial Monte Carlo SE."""
    rate = float(np.mean(hits))
    return rate, float(np.sqrt(rate * (1 - rate) / len(hits)))


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1) / np.sqrt(len(values)))


def run_design_cell(design_name: str, scenario_name: str, audits: int, n_boot: int,
                    n_perm: int, seed: int) -> dict[str, object]:
    """Simulate ``audits`` audits of one design and scenario and summarise the Δ interval
    (:func:`delta_inversion`, boundary from the between-groups permutation test), the raw and
    corrected Δ, the row tests and, for comparison, the max-t band of :func:`delta_bootstrap`.

    Seeds: one :class:`numpy.random.SeedSequence` per (``seed``, design, scenario), so a cell
    gives the same figures whichever others run with it; each audit spawns its own children
    for the data, the bootstrap and each permutation test."""
    scenario = DESIGN_SCENARIOS[scenario_name]
    frame = design(DESIGNS[design_name])
    targets = {race: scenario.base_rate + scenario.race_gaps.get(race, 0.0) for race in RACES}
    offsets = strata_offsets(frame.drop_duplicates("source_id"), scenario.strata_effect)
    etas = {race: linear_predictor(t, scenario.sigma_source, scenario.sigma_prompt, offsets)
            for race, t in targets.items()}
    true_delta = max(targets.values()) - min(targets.values())
    simulator = _Simulator(frame, scenario, etas)
    root = np.random.SeedSequence(
        [seed, list(DESIGNS).index(design_name), list(DESIGN_SCENARIOS).index(scenario_name)])
    names = ("estimate", "corrected", "ci_low", "ci_high", "band_low", "band_high",
             *(f"p_{test}" for test in TESTS), "p_anova", "p_free")
    record = {name: np.empty(audits) for name in names}
    # Each group's rate interval at the design's clustering (the report's) and Wilson's
    # counting requests as independent: covered the planted marginal rate, and width.
    rate_hits = {"clustered": [], "wilson": []}
    rate_width = {"clustered": [], "wilson": []}
    tick = time.perf_counter()
    for audit, child in enumerate(root.spawn(audits)):
        data_seed, boot_seed, *perm_seeds, free_seed = child.spawn(3 + len(TESTS))
        block = prepare_block(simulator.draw(np.random.default_rng(data_seed)),
                              "hard_refusal", "race")
        for test, perm_seed in zip(TESTS, perm_seeds, strict=True):
            record[f"p_{test}"][audit] = group_test_p(block, test, n_perm, perm_seed).p_value
        record["p_anova"][audit] = _anova_p(block)
        # The default statistic permuted freely, ignoring gender and age: what stratifying
        # costs where they have no effect, and buys where they have one.
        record["p_free"][audit] = group_test_p(block, "between-groups", n_perm, free_seed,
                                               stratify=False).p_value
        inverted = delta_inversion(block, record["p_between-groups"][audit], CONFIDENCE,
                                   n_boot, boot_seed)
        band = delta_bootstrap(block, CONFIDENCE, n_boot, boot_seed, 1, resample="two-way")
        record["estimate"][audit] = inverted.estimate
        record["corrected"][audit] = inverted.corrected
        record["ci_low"][audit], record["ci_high"][audit] = inverted.ci_low, inverted.ci_high
        record["band_low"][audit], record["band_high"][audit] = band.ci_low, band.ci_high
        truth = np.array([targets[group] for group in block.groups])
        for kind, (low, high) in (("clustered", rate_intervals(block, CONFIDENCE)),
                                  ("wilson", wilson_interval(block.group_k, block.group_n,
                                                             CONFIDENCE))):
            rate_hits[kind].extend((low <= truth) & (truth <= high))
            rate_width[kind].extend(high - low)
    seconds = time.perf_counter() - tick
    result = summarise_cell(design_name, scenario_name, block, true_delta, record, seconds,
                            n_boot, n_perm, root)
    for kind in rate_hits:
        coverage, coverage_se = _share(np.array(rate_hits[kind]))
        result[f"rate_coverage_{kind}"] = coverage
        result[f"rate_coverage_{kind}_se"] = coverage_se
        result[f"rate_mean_width_{kind}"] = float(np.mean(rate_width[kind]))
    return result


def summarise_cell(design_name: str, scenario_name: str, block, true_delta: float,
                   record: dict[str, np.ndarray], seconds: float, n_boot: int, n_perm: int,
                   root: np.random.SeedSequence) -> dict[str, object]:
    scenario = DESIGN_SCENARIOS[scenario_name]
    audits = len(record["estimate"])
    estimate = record["estimate"]
    low, high = record["ci_low"], record["ci_high"]
    width = high - low
    band_width = record["band_high"] - record["band_low"]
    q_low, q_high = np.quantile(estimate, [0.025, 0.975])
    central = float(q_high - q_low)
    # Monte Carlo SE of width / central range: the audits resampled with replacement.
    rng = np.random.default_rng([*root.entropy, 1])
    picks = rng.integers(0, audits, (_RATIO_BOOT, audits))
    ranges = np.diff(np.quantile(estimate[picks], [0.025, 0.975], axis=1), axis=0)[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = width[picks].mean(axis=1) / ranges
    ratios = ratios[np.isfinite(ratios)]
    coverage, coverage_se = _share((low <= true_delta + 1e-12) & (true_delta <= high + 1e-12))
    band_coverage, band_coverage_se = _share(
        (record["band_low"] <= true_delta + 1e-12) & (true_delta <= record["band_high"] + 1e-12))
    raw_bias, raw_bias_se = _mean_se(estimate - true_delta)
    corrected_bias, corrected_bias_se = _mean_se(record["corrected"] - true_delta)
    result: dict[str, object] = {
        "design": design_name,
        "scenario": scenario_name,
        "description": scenario.name,
        "sources_per_race": int(block.group_sources[0]),
        "sources": int(block.n_sources),
        "prompts": int(block.n_prompts),
        "audits": audits,
        "bootstrap": n_boot,
        "permutations": n_perm,
        "base_rate": scenario.base_rate,
        "sigma_source": scenario.sigma_source,
        "sigma_prompt": scenario.sigma_prompt,
        "true_delta": true_delta,
        "interval_resample": "sources" if block.crossed else "two-way",
        "coverage": coverage,
        "coverage_se": coverage_se,
        "miss_below": float(np.mean(high < true_delta - 1e-12)),
        "miss_above": float(np.mean(low > true_delta + 1e-12)),
        "mean_width": float(width.mean()),
        "mean_width_se": float(width.std(ddof=1) / np.sqrt(audits)),
        "delta_hat_q025": float(q_low),
        "delta_hat_q975": float(q_high),
        "delta_hat_central_range": central,
        "width_ratio": float(width.mean() / central) if central > 0 else float("nan"),
        "width_ratio_se": float(ratios.std(ddof=1)) if len(ratios) > 1 else float("nan"),
        "mean_delta_hat": float(estimate.mean()),
        "raw_bias": raw_bias,
        "raw_bias_se": raw_bias_se,
        "mean_corrected": float(record["corrected"].mean()),
        "corrected_bias": corrected_bias,
        "corrected_bias_se": corrected_bias_se,
        "band_coverage": band_coverage,
        "band_coverage_se": band_coverage_se,
        "band_mean_width": float(band_width.mean()),
        "band_width_ratio": float(band_width.mean() / central) if central > 0 else float("nan"),
    }
    for key in (*TESTS, "anova", "free"):
        rate, rate_se = _share(record[f"p_{key}"] < ALPHA)
        result[f"reject_{key}"] = rate
        result[f"reject_{key}_se"] = rate_se
    # Paired over the same audits: between-groups permutation test minus the ANOVA.
    paired = ((record["p_between-groups"] < ALPHA).astype(float)
              - (record["p_anova"] < ALPHA).astype(float))
    result["reject_between_minus_anova"], result["reject_between_minus_anova_se"] = (
        _mean_se(paired))
    result["seconds"] = seconds
    return result


def designs_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="simulation_study.py designs",
        description="Coverage, width and bias of the default Δ interval and power of the row "
                    "tests at half, the study's and double the sources per race.")
    parser.add_argument("--audits", type=int, default=200)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--permutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--designs", choices=list(DESIGNS), nargs="+", default=list(DESIGNS))
    parser.add_argument("--scenarios", choices=list(DESIGN_SCENARIOS), nargs="+",
                        default=list(DESIGN_SCENARIOS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = []
    tick = time.perf_counter()
    for design_name in args.designs:
        for scenario_name in args.scenarios:
            row = run_design_cell(design_name, scenario_name, args.audits, args.bootstrap,
                                  args.permutations, args.seed)
            print(json.dumps(row), flush=True)
            results.append(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "machine": {"cpu": platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "settings": {"audits": args.audits, "bootstrap": args.bootstrap,
                         "permutations": args.permutations, "seed": args.seed,
                         "confidence": CONFIDENCE, "alpha": ALPHA, "prompts": PROMPTS,
                         "designs": {name: len(GENDERS) * len(DESIGNS[name])
                                     for name in args.designs},
                         "seconds": time.perf_counter() - tick},
            "results": results,
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")


def main() -> None:
    if sys.argv[1:2] == ["designs"]:
        designs_main(sys.argv[2:])
        return
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
