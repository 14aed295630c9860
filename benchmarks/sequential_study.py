"""Simulation study of the sequential audit: does it keep its error rate, and what does it save?

Simulates audits of one prompt category run round by round: each round edits one new source
of each of the 7 races with the same 10 prompts (70 requests), with the generative model of
``benchmarks/simulation_study.py`` (base refusal rate 10%, a random effect of SD 0.8 on the
logit for every source and every prompt; the race rates are the marginal rates, solved by its
:func:`linear_predictor`). After each round the declared Δ (refusal, max − min over the races)
gets the confidence sequence of :mod:`acrb.analysis.estimation.sequential` (21 pair CSs at
α/21 each, α = 0.05), and the audit stops when Δ is decided: "gap" (CS excludes 0) or
"equivalent" (CS inside [0, margin]), or when its budget is spent. Three scenarios: no gap,
Black +10 pp, Black +30 pp. The bounds compared (:data:`BOUNDS`): the bounded hedged and
empirical-Bernstein CSs, and the asymptotic CS (valid only as the rounds grow) with its
variance guard and, to show what the guard does, without it; and the default hedged and the
asymptotic CS with half of α spent on Δ's upper bound alone (``upper_share`` 0.5: the pair
CSs at α/42, the upper bound's second set at α/2).

It reports, per bound:

(a) the share of audits whose CS covers the true Δ at every round up to the horizon. The CS
    estimates Δ of the audit's own prompt catalog (the 10 prompts are drawn once per audit
    and shared by every round), computed exactly by quadrature over the source effect; the
    coverage of the planted marginal Δ is given beside it, and the coverage through round t
    for t = 1, 5, 10, 20, 30, 50, 100, 300 (where an asymptotic CS fails, if it does);
(b) the share of audits without a gap that are ever flagged as a gap;
(c) requests used against the fixed design of the same power: the fixed design's size is
    the smallest even number of sources per race at which the pipeline's own test (the
    between-groups permutation test over sources, :func:`group_test_p`) rejects in 80% of
    audits at 10 pp (and at 30 pp); for "no gap", the size at which the existing equivalence
    test (:func:`tost_delta`, design-effect corrected, same margin) concludes equivalence in
    80% of audits. The sequential audit's budget is sized the same way: the fewest rounds by
    which 80% of the 10 pp audits have decided "gap". Savings are 1 − median requests used
    / requests of the fixed design; the price of sequentiality is budget / fixed size at 10 pp.

The fixed designs are evaluated on the first n rounds of the same simulated audits (a fixed
design of n sources per race is a sequential audit's first n rounds), so both designs see the
same data. Usage::

    python benchmarks/sequential_study.py --audits 500 \\
        --out benchmarks/results/sequential_study.json \\
        --markdown benchmarks/results/sequential_study.md
    python benchmarks/sequential_study.py --tiny --out /tmp/sequential_tiny.json

Why not :func:`simulation_study.simulate`: it draws one pandas frame per audit, which for 500
audits x 300 rounds x 70 requests is far too slow; :func:`draw_audits` draws the same model
with numpy, with every round's sources independent and the prompts shared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parent))  # simulation_study lives beside this

from acrb.analysis.estimation.resampling import Block, group_test_p
from acrb.analysis.estimation.sequential import (
    GRID,
    DeclaredDelta,
    first_decided_round,
    group_pairs,
    is_equivalent,
    is_gap,
    pair_level,
    range_bounds,
    stop_rounds,
    upper_level,
)
from acrb.analysis.tests.equivalence import tost_delta
from acrb.demographics import AGES, GENDERS, RACES
from simulation_study import (
    ALPHA,
    PROMPTS,
    SCENARIOS,
    Scenario,
    design,
    linear_predictor,
    marginal_rate,
)

STUDY_SCENARIOS: dict[str, Scenario] = {
    "null": SCENARIOS["null"],
    "gap10": SCENARIOS["gap10"],
    "gap30": Scenario("planted 30 pp gap (Black +30 pp)", 0.10, {"Black": 0.30}, 0.8, 0.8),
}
#: The bounds compared: (method, keyword arguments of difference_confidence_sequence). The
#: first is the module's default. The asymptotic CS is shown with the module's variance guard
#: (prior_rounds = 1: the worst-case variance counted as one round), and without it (the plain
#: variance, prior_rounds = 0), also with nothing decided before round 10 or 20 instead.
BOUNDS: dict[str, tuple[str, dict[str, float]]] = {
    "hedged, c = 3/4": ("hedged", {"truncation": 0.75}),
    "hedged, c = 1/2": ("hedged", {"truncation": 0.5}),
    "empirical Bernstein, c = 1/2": ("empirical-bernstein", {"truncation": 0.5}),
    "asymptotic, t_opt = 30": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 1.0}),
    "hedged, c = 3/4, half of α on the upper bound": ("hedged", {"truncation": 0.75,
                                                                 "upper_share": 0.5}),
    "asymptotic, t_opt = 30, half of α on the upper bound": (
        "asymptotic", {"t_opt": 30.0, "prior_rounds": 1.0, "upper_share": 0.5}),
    "asymptotic, no guard": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 0.0}),
    "asymptotic, no prior, min 10 rounds": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 0.0,
                                                          "min_rounds": 10}),
    "asymptotic, no prior, min 20 rounds": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 0.0,
                                                          "min_rounds": 20}),
}
#: Rounds at which coverage so far is reported.
COVERAGE_ROUNDS = (1, 5, 10, 20, 30, 50, 100, 300)
POWER = 0.8
#: The fixed design of the same power for each truth: the gap test sized for that gap, and
#: for no gap the equivalence test.
OWN_REFERENCE = {"null": "fixed_equivalence", "gap10": "fixed_gap10", "gap30": "fixed_gap30"}
#: The project's default equivalence margin (params.yaml analyze.equivalence_margin), shown
#: beside the study's margin.
DEFAULT_MARGIN = 0.03
_EPS = 1e-12


@dataclass(frozen=True)
class Settings:
    audits: int
    horizon: int
    margin: float
    grid: int
    fixed_audits: int
    permutations: int
    seed: int
    bounds: tuple[str, ...]


def race_etas(scenario: Scenario) -> np.ndarray:
    """Linear predictor of each race (RACES order) whose marginal rate is its target."""
    return np.array([linear_predictor(scenario.base_rate + scenario.race_gaps.get(race, 0.0),
                                      scenario.sigma_source, scenario.sigma_prompt)
                     for race in RACES])


def draw_audits(scenario: Scenario, etas: np.ndarray, audits: int, rounds: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Refusals of ``audits`` audits of ``rounds`` rounds: a bool array (audits, rounds,
    races, prompts), one new source per race and round, and the prompt effects
    (audits, prompts), drawn once per audit."""
    prompt_effect = rng.normal(0.0, scenario.sigma_prompt, (audits, PROMPTS))
    refused = np.empty((audits, rounds, len(RACES), PROMPTS), dtype=bool)
    step = max(1, 200_000 // (rounds * len(RACES) * PROMPTS))
    for start in range(0, audits, step):
        stop = min(start + step, audits)
        source_effect = rng.normal(0.0, scenario.sigma_source, (stop - start, rounds, len(RACES)))
        eta = (etas[None, None, :, None] + source_effect[..., None]
               + prompt_effect[start:stop, None, None, :])
        refused[start:stop] = rng.random(eta.shape) < expit(eta)
    return refused, prompt_effect


def catalog_rates(scenario: Scenario, etas: np.ndarray, prompt_effect: np.ndarray) -> np.ndarray:
    """(audits, races) expected refusal rate of a new source of each race under the audit's
    own prompts: the mean over prompts of E_u[expit(η + u + v_p)] (quadrature, u the source
    effect). This is the mean the sequential CS estimates."""
    rates = np.empty((prompt_effect.shape[0], len(etas)))
    distinct = {float(eta): None for eta in etas}
    for eta in distinct:
        table = np.array([[marginal_rate(eta + v, scenario.sigma_source, 0.0) for v in row]
                          for row in prompt_effect])
        rates[:, etas == eta] = table.mean(axis=1)[:, None]
    return rates


def _share(hits: np.ndarray) -> dict[str, float]:
    rate = float(np.mean(hits))
    return {"value": rate, "se": float(math.sqrt(rate * (1 - rate) / max(len(hits), 1)))}


# --------------------------------------------------------------------------------------------
# The fixed design: the pipeline's tests on the first n rounds


def fixed_block(refused: np.ndarray) -> Block:
    """The :class:`Block` the pipeline's ``prepare_block`` builds for a fixed design of the
    n sources per race in ``refused`` (n, races, prompts): sources ordered by race, the
    source of round t of gender GENDERS[t % 2] and age AGES[(t // 2) % 6] (the order a
    balanced design fills its cells), so the test permutes within gender x age as the
    pipeline does."""
    n = refused.shape[0]
    y = np.transpose(refused, (1, 0, 2)).reshape(len(RACES) * n, PROMPTS).astype(float)
    rounds = np.tile(np.arange(n), len(RACES))
    return Block(
        outcome="hard_refusal", dimension="race", groups=tuple(RACES),
        source_ids=np.array([f"s{i:04d}" for i in range(len(RACES) * n)]),
        prompt_ids=np.array([f"p{j:02d}" for j in range(PROMPTS)]),
        group_index=np.repeat(np.arange(len(RACES)), n),
        prompt_stratum=np.zeros(PROMPTS, dtype=np.int64), y=y, n=np.ones_like(y),
        covariates={"gender": np.array([GENDERS[t % 2] for t in rounds], dtype=object),
                    "age": np.array([AGES[(t // 2) % len(AGES)] for t in rounds],
                                    dtype=object)},
        crossed=True)


def gap_test_power(refused: np.ndarray, n: int, permutations: int, seed: int) -> float:
    """Share of audits whose first ``n`` rounds reject "no difference between races" at α by
    the between-groups permutation test (``analyze.test``'s default)."""
    seeds = np.random.SeedSequence([seed, n]).spawn(len(refused))
    hits = [group_test_p(fixed_block(audit[:n]), "between-groups", permutations,
                         np.random.default_rng(s)).p_value < ALPHA
            for audit, s in zip(refused, seeds, strict=True)]
    return float(np.mean(hits))


def equivalence_power(refused: np.ndarray, n: int, margin: float) -> float:
    """Share of audits whose first ``n`` rounds (n even) conclude Δ < ``margin`` by the
    project's equivalence test (:func:`tost_delta`, design effect estimated)."""
    frame = design(tuple(AGES[i % len(AGES)] for i in range(n // 2)))
    hits = []
    for audit in refused:
        # design() lists sources race by race, each with all its prompts, as here.
        outcome = np.transpose(audit[:n], (1, 0, 2)).reshape(-1)
        frame["hard_refusal"] = outcome
        result = tost_delta(frame, "hard_refusal", "race", margin=margin, alpha=ALPHA, deff=None)
        hits.append(result.equivalent)
    return float(np.mean(hits))


def smallest_design(power_at, horizon: int, *, step: int = 2, unit: str = "sources_per_race",
                    requests_per_unit: int = len(RACES) * PROMPTS) -> dict[str, object]:
    """Smallest n ≤ horizon, a multiple of ``step`` (even by default: a source of each gender),
    with power_at(n) ≥ POWER: doubling, then bisection (power rises with n). Returns n under
    the key ``unit`` (None if not reached), its power and requests (n x
    ``requests_per_unit``), and every n evaluated with its power."""
    evaluated: dict[int, float] = {}

    def power(n: int) -> float:
        if n not in evaluated:
            evaluated[n] = power_at(n)
        return evaluated[n]

    low, high = 0, step
    while power(high) < POWER:
        low, high = high, high * 2
        if high > horizon:
            high = horizon - horizon % step
            if power(high) < POWER:
                return {unit: None, "evaluated": _table(evaluated, unit)}
            break
    while high - low > step:
        middle = (low + high) // (2 * step) * step
        if middle in (low, high):
            break
        if power(middle) >= POWER:
            high = middle
        else:
            low = middle
    return {unit: high, "power": evaluated[high], "requests": high * requests_per_unit,
            "evaluated": _table(evaluated, unit)}


def _table(evaluated: dict[int, float], unit: str = "sources_per_race") -> list[dict[str, float]]:
    return [{unit: n, "power": p} for n, p in sorted(evaluated.items())]


# --------------------------------------------------------------------------------------------
# The sequential audit


@dataclass(frozen=True)
class SequentialRun:
    """One bound on one scenario's audits: per audit and round, the Δ CS and the truth."""

    lower: np.ndarray           # (audits, rounds)
    upper: np.ndarray
    pair_covered: np.ndarray    # (audits,) every pair CS covered its catalog gap at every round
    catalog_delta: np.ndarray   # (audits,)
    planted_delta: float
    seconds: float


def run_bound(refused: np.ndarray, catalog: np.ndarray, planted_delta: float, method: str,
              options: dict[str, float], grid: int) -> SequentialRun:
    delta = DeclaredDelta("delta_refusal", tuple(RACES))
    options = dict(options)
    share = options.pop("upper_share", 0.0)
    level = pair_level(ALPHA, [delta], delta, share)
    top = upper_level(ALPHA, [delta], delta, share)
    tick = time.perf_counter()
    means = refused.mean(axis=-1)  # (audits, rounds, races): the round's cluster means
    a, b = group_pairs(len(RACES))
    differences = np.moveaxis(means[..., a] - means[..., b], -1, -2)  # (audits, pairs, rounds)
    lower, upper, low, high = range_bounds(differences, level, upper_level=top, method=method,  # type: ignore[arg-type]
                                           grid=grid, **options)  # type: ignore[arg-type]
    seconds = time.perf_counter() - tick
    true_pairs = (catalog[:, a] - catalog[:, b])[..., None]
    pair_covered = ((low <= true_pairs + _EPS) & (high >= true_pairs - _EPS)).all(axis=(1, 2))
    return SequentialRun(lower, upper, pair_covered, catalog.max(axis=1) - catalog.min(axis=1),
                         planted_delta, seconds)


def gap_rounds(run: SequentialRun) -> np.ndarray:
    """First round (1-based) at which the CS excludes 0, 0 if never within the horizon."""
    flagged = is_gap(run.lower, run.upper)
    return np.where(flagged.any(axis=1), np.argmax(flagged, axis=1) + 1, 0)


def sized_budget(gap10: SequentialRun) -> tuple[int, bool]:
    """Fewest rounds by which POWER of the 10 pp audits have decided "gap" (the sequential
    audit sized for the fixed design's power), and whether the horizon allowed it."""
    first = gap_rounds(gap10)
    horizon = gap10.lower.shape[1]
    decided = np.array([np.mean((first > 0) & (first <= r)) for r in range(1, horizon + 1)])
    reached = decided >= POWER
    return (int(np.argmax(reached)) + 1, True) if reached.any() else (horizon, False)


def _quantiles(rounds: np.ndarray) -> dict[str, float | None]:
    """Quantiles of first-decision rounds, None where beyond the horizon (0 = never)."""
    values = np.where(rounds > 0, rounds, np.inf).astype(float)
    out: dict[str, float | None] = {}
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        value = float(np.quantile(values, q, method="inverted_cdf"))
        out[f"q{int(q * 100):02d}"] = None if math.isinf(value) else value
    return out


def summarise(run: SequentialRun, margin: float, budget: int,
              fixed: dict[str, dict[str, object]], scenario: str) -> dict[str, object]:
    audits, horizon = run.lower.shape
    requests_per_round = len(RACES) * PROMPTS
    truth = run.catalog_delta[:, None]
    covered = (run.lower <= truth + _EPS) & (truth - _EPS <= run.upper)
    planted = (run.lower <= run.planted_delta + _EPS) & (run.planted_delta - _EPS <= run.upper)
    first_gap = gap_rounds(run)
    first = first_decided_round(run.lower, run.upper, margin)
    stop, reason = stop_rounds([first], horizon, budget)
    at = np.arange(audits), stop - 1
    gap_at_stop = is_gap(run.lower[at], run.upper[at])
    equivalent_at_stop = ~gap_at_stop & is_equivalent(run.lower[at], run.upper[at], margin)
    until_stop = np.arange(horizon)[None, :] < stop[:, None]
    requests = stop * requests_per_round
    median = float(np.median(requests))
    out: dict[str, object] = {
        "catalog_delta_mean": float(run.catalog_delta.mean()),
        "planted_delta": run.planted_delta,
        "coverage_all_rounds": _share(covered.all(axis=1)),
        "coverage_until_stop": _share((covered | ~until_stop).all(axis=1)),
        "pair_coverage_all_rounds": _share(run.pair_covered),
        "coverage_of_planted_delta_all_rounds": _share(planted.all(axis=1)),
        "coverage_through_round": {str(r): _share(covered[:, :r].all(axis=1))
                                   for r in COVERAGE_ROUNDS if r <= horizon},
        "gap_flagged_by_horizon": _share(first_gap > 0),
        "gap_flagged_by_budget": _share((first_gap > 0) & (first_gap <= budget)),
        "stop_decided_share": _share(reason == "decided"),
        "stop_gap_share": _share(gap_at_stop),
        "stop_equivalent_share": _share(equivalent_at_stop),
        "stop_budget_share": _share(reason == "budget"),
        "first_gap_round": _quantiles(first_gap),
        "first_decided_round": _quantiles(first),
        "equivalent_by_horizon": {
            f"{m:g}": _share(is_equivalent(run.lower, run.upper, m).any(axis=1))
            for m in (margin, DEFAULT_MARGIN)},
        "requests_median": median,
        "requests_mean": float(np.mean(requests)),
        "mean_width_at_budget": float(np.mean(run.upper[:, budget - 1] - run.lower[:, budget - 1])),
        "cs_seconds": run.seconds,
    }
    for key, reference_name in (("saving_vs_fixed_gap10", "fixed_gap10"),
                                ("saving_vs_own_fixed_design", OWN_REFERENCE[scenario])):
        fixed_requests = fixed[reference_name].get("requests")
        out[key] = (1.0 - median / fixed_requests if isinstance(fixed_requests, int)
                    else None)
    out["own_fixed_design"] = OWN_REFERENCE[scenario]
    gap10 = fixed["fixed_gap10"].get("sources_per_race")
    if scenario != "null" and isinstance(gap10, int):
        out["gap_share_by_fixed_gap10_size"] = _share((first_gap > 0) & (first_gap <= gap10))
    return out


def run_study(settings: Settings, log=print) -> dict[str, object]:
    tick = time.perf_counter()
    root = np.random.SeedSequence(settings.seed)
    draws = {}
    for (name, scenario), child in zip(STUDY_SCENARIOS.items(), root.spawn(len(STUDY_SCENARIOS)),
                                       strict=True):
        etas = race_etas(scenario)
        rng = np.random.default_rng(child)
        refused, prompt_effect = draw_audits(scenario, etas, settings.audits, settings.horizon,
                                             rng)
        targets = [scenario.base_rate + scenario.race_gaps.get(r, 0.0) for r in RACES]
        draws[name] = (refused, catalog_rates(scenario, etas, prompt_effect),
                       max(targets) - min(targets))
        log(f"drew {name}: {settings.audits} audits x {settings.horizon} rounds")
    fixed_audits = min(settings.fixed_audits, settings.audits)
    fixed = {
        "fixed_gap10": smallest_design(
            lambda n: gap_test_power(draws["gap10"][0][:fixed_audits], n, settings.permutations,
                                     settings.seed), settings.horizon),
        "fixed_gap30": smallest_design(
            lambda n: gap_test_power(draws["gap30"][0][:fixed_audits], n, settings.permutations,
                                     settings.seed), settings.horizon),
        "fixed_equivalence": smallest_design(
            lambda n: equivalence_power(draws["null"][0][:fixed_audits], n, settings.margin),
            settings.horizon),
    }
    log(f"fixed designs: {json.dumps({k: v.get('sources_per_race') for k, v in fixed.items()})}")
    bounds = {}
    for label in settings.bounds:
        method, options = BOUNDS[label]
        runs = {name: run_bound(refused, catalog, planted, method, options, settings.grid)
                for name, (refused, catalog, planted) in draws.items()}
        budget, reached = sized_budget(runs["gap10"])
        scenarios = {name: summarise(run, settings.margin, budget, fixed, name)
                     for name, run in runs.items()}
        gap10_size = fixed["fixed_gap10"].get("sources_per_race")
        price = budget / gap10_size if isinstance(gap10_size, int) else None
        bounds[label] = {
            "method": method, "truncation": options.get("truncation"), "options": options,
            "budget_rounds": budget, "budget_reached_power": reached,
            "budget_requests": budget * len(RACES) * PROMPTS,
            "price_of_sequentiality_gap10": price,
            "scenarios": scenarios,
            "targets": target_check(scenarios),
        }
        log(f"{label}: budget {budget} rounds, {json.dumps(bounds[label]['targets'])}")
    return {
        "settings": {
            "audits": settings.audits, "horizon_rounds": settings.horizon,
            "margin": settings.margin, "grid": settings.grid,
            "fixed_audits": fixed_audits, "permutations": settings.permutations,
            "seed": settings.seed, "alpha": ALPHA, "power": POWER, "prompts": PROMPTS,
            "races": len(RACES), "sources_per_race_per_round": 1,
            "requests_per_round": len(RACES) * PROMPTS,
            "declared_deltas": ["refusal, max - min over races (21 pairs at alpha/21)"],
            "scenarios": {name: s.name for name, s in STUDY_SCENARIOS.items()},
            "sigma_source": STUDY_SCENARIOS["null"].sigma_source,
            "sigma_prompt": STUDY_SCENARIOS["null"].sigma_prompt,
            "base_rate": STUDY_SCENARIOS["null"].base_rate,
        },
        "fixed_designs": fixed,
        "bounds": bounds,
        "machine": {"cpu": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "seconds": time.perf_counter() - tick,
    }


def target_check(scenarios: dict[str, dict[str, object]]) -> dict[str, object]:
    """The issue's targets, met or not."""
    def value(scenario: str, key: str) -> float:
        entry = scenarios[scenario][key]
        return float(entry["value"]) if isinstance(entry, dict) else float(entry)  # type: ignore[arg-type]

    coverage = min(value(s, "coverage_all_rounds") for s in scenarios)
    flags = value("null", "gap_flagged_by_horizon")
    saving30 = scenarios["gap30"].get("saving_vs_fixed_gap10")
    saving0 = scenarios["null"].get("saving_vs_fixed_gap10")
    return {
        "coverage_at_every_round_min": coverage, "coverage_met": coverage >= 0.95,
        "null_flagged_as_gap": flags, "null_flags_met": flags <= 0.05,
        "saving_gap30": saving30, "saving_null": saving0,
        "saving_met": (isinstance(saving30, float) and isinstance(saving0, float)
                       and saving30 >= 0.5 and saving0 >= 0.5),
    }


# --------------------------------------------------------------------------------------------
# Report


def _pct(entry: object) -> str:
    if isinstance(entry, dict):
        return f"{100 * entry['value']:.1f}%"
    if entry is None:
        return "n/a"
    return f"{100 * float(entry):.1f}%"  # type: ignore[arg-type]


def markdown(result: dict[str, object], command: str) -> str:
    settings = result["settings"]
    fixed = result["fixed_designs"]
    assert isinstance(settings, dict) and isinstance(fixed, dict)
    bounds = result["bounds"]
    assert isinstance(bounds, dict)
    lines = [
        "# Sequential audit: error rate and requests saved (`sequential_study.py`)",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{settings['audits']} simulated audits per scenario; each round adds one source per "
        f"race (7 races x {settings['prompts']} prompts = {settings['requests_per_round']} "
        f"requests); base refusal rate {settings['base_rate']:.0%}, source and prompt effects "
        f"SD {settings['sigma_source']} on the logit (`simulation_study.py`'s model); one "
        f"declared Δ (refusal, max − min over races, 21 pair CSs at α/21, α = "
        f"{settings['alpha']}; with half of α on the upper bound: the pair CSs at α/42 and "
        f"the upper bound's second set at α/2); equivalence margin {settings['margin']}; horizon "
        f"{settings['horizon_rounds']} rounds; hedged grid {settings['grid']}; "
        f"{result['seconds']:.0f} s on {result['machine']['cpus']} CPUs "  # type: ignore[index]
        f"(shared). Monte Carlo SE of a share near 95% is about 1 point.",
        "",
        "Fixed designs (the pipeline's tests, 80% power, "
        f"{settings['fixed_audits']} audits, {settings['permutations']} permutations):",
        "",
        "| reference | sources per race | requests | power there |",
        "| --- | --- | --- | --- |",
    ]
    names = {"fixed_gap10": "between-groups permutation test, 10 pp gap",
             "fixed_gap30": "between-groups permutation test, 30 pp gap",
             "fixed_equivalence": f"equivalence (TOST, margin {settings['margin']}), no gap"}
    for key, label in names.items():
        entry = fixed[key]
        if entry.get("sources_per_race") is None:
            lines.append(f"| {label} | > {settings['horizon_rounds']} | n/a | n/a |")
        else:
            lines.append(f"| {label} | {entry['sources_per_race']} | {entry['requests']} | "
                         f"{entry['power']:.1%} |")
    lines += ["", "Sequential audits (budget: the rounds by which 80% of the 10 pp audits "
              "decided a gap):", "",
              "| bound | scenario | covers Δ at every round | flagged as gap | stops: gap / "
              "equivalent / budget | median rounds to decide | median requests (budget) | "
              "saving vs fixed 10 pp design | saving vs fixed design for this truth |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, entry in bounds.items():
        for name, row in entry["scenarios"].items():
            decided = row["first_decided_round"]["q50"]
            lines.append(
                f"| {label} | {name} | {_pct(row['coverage_all_rounds'])} | "
                f"{_pct(row['gap_flagged_by_horizon'])} | {_pct(row['stop_gap_share'])} / "
                f"{_pct(row['stop_equivalent_share'])} / {_pct(row['stop_budget_share'])} | "
                f"{'> horizon' if decided is None else int(decided)} | "
                f"{row['requests_median']:.0f} ({entry['budget_requests']}) | "
                f"{_pct(row.get('saving_vs_fixed_gap10'))} | "
                f"{_pct(row.get('saving_vs_own_fixed_design'))} |")
    lines += ["", "| bound | budget (rounds) | 80% power reached in horizon | price of "
              "sequentiality at 10 pp (budget / fixed size) | 10 pp audits decided by the "
              "fixed design's size | targets: coverage ≥ 95% / flags ≤ 5% / saving ≥ 50% |",
              "| --- | --- | --- | --- | --- | --- |"]
    for label, entry in bounds.items():
        t = entry["targets"]
        price = entry["price_of_sequentiality_gap10"]
        shown = ("n/a" if price is None else f"{price:.1f}x" if entry["budget_reached_power"]
                 else f"> {price:.1f}x (80% not reached)")
        by_fixed = entry["scenarios"]["gap10"].get("gap_share_by_fixed_gap10_size")
        lines.append(
            f"| {label} | {entry['budget_rounds']} | {entry['budget_reached_power']} | "
            f"{shown} | {_pct(by_fixed)} | "
            f"{'met' if t['coverage_met'] else 'NOT met'} / "
            f"{'met' if t['null_flags_met'] else 'NOT met'} / "
            f"{'met' if t['saving_met'] else 'NOT met'} |")
    lines += ["", "Coverage of Δ through round t (share of audits whose CS covered Δ at every "
              "round up to t):", "",
              "| bound | scenario | " + " | ".join(
                  f"t = {r}" for r in COVERAGE_ROUNDS if r <= settings["horizon_rounds"]) + " |",
              "| --- | --- | " + " | ".join(
                  "---" for r in COVERAGE_ROUNDS if r <= settings["horizon_rounds"]) + " |"]
    for label, entry in bounds.items():
        for name, row in entry["scenarios"].items():
            through = row["coverage_through_round"]
            lines.append(f"| {label} | {name} | "
                         + " | ".join(_pct(through[k]) for k in through) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=500)
    parser.add_argument("--horizon", type=int, default=300,
                        help="rounds simulated per audit (coverage is checked at all of them)")
    parser.add_argument("--margin", type=float, default=0.10,
                        help="equivalence margin (rate units); default: the 10 pp gap the "
                             "fixed design is powered for")
    parser.add_argument("--grid", type=int, default=GRID)
    parser.add_argument("--fixed-audits", type=int, default=500)
    parser.add_argument("--permutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--bounds", choices=list(BOUNDS), nargs="+", default=None,
                        help="bounds to compare (default: all; with --tiny, the first)")
    parser.add_argument("--tiny", action="store_true",
                        help="a quick run (40 audits, 60 rounds, the default bound unless "
                             "--bounds)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        settings = Settings(audits=40, horizon=60, margin=args.margin, grid=100,
                            fixed_audits=20, permutations=200, seed=args.seed,
                            bounds=tuple(args.bounds or [next(iter(BOUNDS))]))
    else:
        settings = Settings(args.audits, args.horizon, args.margin, args.grid,
                            args.fixed_audits, args.permutations, args.seed,
                            tuple(args.bounds or BOUNDS))
    result = run_study(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    command = "python benchmarks/sequential_study.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    result["command"] = command.strip()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(result, result["command"]))  # type: ignore[arg-type]
    return result


if __name__ == "__main__":
    main()
