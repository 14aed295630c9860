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
its variance guard, and the hedged CS with half of α on Δ's upper bound alone,
``upper_share`` 0.5): the share of audits whose Δ CS covers the true Δ at every round up to the
horizon, the share of no-gap audits ever flagged, the rounds to a decision, and the base
prompts used against two fixed designs:

- the ACRB T2I design (100 base prompts, 2,500 requests), where the audit stops at its decision
  or at the design's end;
- the fixed design of the same power: the fewest base prompts at which the T2I analysis' own
  test of the culture row (:func:`acrb.analysis.experiments.attributes.attribute_disparities`'s
  between-groups permutation test, culture labels permuted within base prompts, its unadjusted
  p < α) rejects in 80% of the same audits' first base prompts, for the 10-point and the
  30-point gap. The sequential audit is then sized the same way (its budget: the base prompts by
  which 80% of the 10-point audits have decided "gap", or the horizon where fewer have) and its
  median use compared with each; for no gap, the fewest base prompts at which the T2I
  analysis' equivalence test (:func:`acrb.analysis.experiments.attributes.design_equivalence`:
  paired TOST per pair of cultures over base prompts, intersection-union, at the study's
  margin) shows "no gap" in 80% of the no-gap audits.

Usage::

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

from acrb.analysis.estimation.resampling import group_test_p
from acrb.analysis.estimation.sequential import (
    DeclaredDelta,
    first_decided_round,
    group_pairs,
    is_equivalent,
    is_gap,
    pair_level,
    range_bounds,
    upper_level,
)
from acrb.analysis.experiments.attributes import (
    AttributeDesign,
    _permutation_block,
    design_equivalence,
)
from sequential_study import POWER, smallest_design
from simulation_study import ALPHA, linear_predictor

CULTURES = ("egyptian", "filipino", "indian", "korean", "mexican", "nigerian", "scottish")
#: The gap is planted on this culture.
GAP_CULTURE = "nigerian"
#: The ACRB T2I design: 100 base prompts, each with 25 variants.
DESIGN_PROMPTS = 100
VARIANTS = 25
SCENARIOS = {"null": 0.0, "gap10": 0.10, "gap30": 0.30}
BOUNDS = {"hedged, c = 3/4 (default)": ("hedged", {"truncation": 0.75}),
          "asymptotic, t_opt = 30": ("asymptotic", {"t_opt": 30.0, "prior_rounds": 1.0}),
          "hedged, c = 3/4, half of α on the upper bound": ("hedged", {"truncation": 0.75,
                                                                       "upper_share": 0.5})}
#: The equivalence margin: plan.sequential.margin's default.
MARGIN = 0.05
#: Margins at which the share of no-gap audits shown equivalent by the horizon is also given.
REPORTED_MARGINS = (0.05, 0.10)
#: The fixed design sized for each truth's power.
OWN_REFERENCE = {"null": "fixed_equivalence", "gap10": "fixed_gap10", "gap30": "fixed_gap30"}
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


def fixed_design(refused: np.ndarray) -> AttributeDesign:
    """The :class:`AttributeDesign` the T2I analysis builds from a fixed design whose base
    prompts are the rows of ``refused`` (base prompts, cultures): one request per base prompt
    and culture, one safety domain."""
    count = refused.shape[0]
    return AttributeDesign(
        outcome="hard_refusal", base_ids=np.array([f"b{i:04d}" for i in range(count)],
                                                  dtype=object),
        stratum=np.zeros(count, dtype=np.int64),
        attributes=tuple(f"culture:{c}" for c in CULTURES),
        y=refused.astype(float), n=np.ones(refused.shape, dtype=float))


def fixed_gap_p(refused: np.ndarray, permutations: int, seed: np.random.SeedSequence) -> float:
    """The p-value the T2I analysis gives the culture row of a fixed design (``refused``: base
    prompts x cultures): the between-groups permutation test with culture labels permuted
    within base prompts, as :func:`attribute_disparities` calls it."""
    design = fixed_design(refused)
    columns = design.columns(design.attributes)
    block = _permutation_block(design, columns, "culture")
    return group_test_p(block, "between-groups", permutations, seed, stratify=True).p_value


def gap_test_power(refused: np.ndarray, n: int, permutations: int, seed: int) -> float:
    """Share of audits whose first ``n`` base prompts the T2I analysis flags at α."""
    seeds = np.random.SeedSequence([seed, n]).spawn(len(refused))
    return float(np.mean([fixed_gap_p(audit[:n], permutations, s) < ALPHA
                          for audit, s in zip(refused, seeds, strict=True)]))


def equivalence_power(refused: np.ndarray, n: int, margin: float) -> float:
    """Share of audits whose first ``n`` base prompts the T2I analysis' equivalence test shows
    inside ``margin`` at α (:func:`design_equivalence` over every culture)."""
    hits = []
    for audit in refused:
        design = fixed_design(audit[:n])
        hits.append(bool(design_equivalence(design, design.columns(design.attributes), margin,
                                            ALPHA)["equivalent"]))
    return float(np.mean(hits))


def sized_budget(first_gap: np.ndarray, horizon: int) -> tuple[int, bool]:
    """Fewest base prompts by which POWER of the 10-point audits have decided "gap" (the
    sequential audit sized for the fixed design's power), and whether the horizon allowed it."""
    decided = np.array([np.mean((first_gap > 0) & (first_gap <= r))
                        for r in range(1, horizon + 1)])
    reached = decided >= POWER
    return (int(np.argmax(reached)) + 1, True) if reached.any() else (horizon, False)


def _share(hits: np.ndarray) -> dict[str, float]:
    rate = float(np.mean(hits))
    return {"value": rate, "se": float(math.sqrt(rate * (1 - rate) / max(len(hits), 1)))}


def run_bound(refused: np.ndarray, truth: float, method: str, options: dict[str, float],
              grid: int, margin: float = MARGIN) -> dict[str, object]:
    delta = DeclaredDelta("refusal_culture", CULTURES, margin=margin)
    options = dict(options)
    share = options.pop("upper_share", 0.0)
    level = pair_level(ALPHA, [delta], delta, share)
    top = upper_level(ALPHA, [delta], delta, share)
    tick = time.perf_counter()
    a, b = group_pairs(len(CULTURES))
    y = refused.astype(float)
    differences = np.moveaxis(y[..., a] - y[..., b], -1, -2)  # (audits, pairs, rounds)
    lower, upper, _, _ = range_bounds(differences, level, upper_level=top, method=method,  # type: ignore[arg-type]
                                      grid=grid, **options)  # type: ignore[arg-type]
    seconds = time.perf_counter() - tick
    covered = (lower <= truth + _EPS) & (truth - _EPS <= upper)
    flagged = is_gap(lower, upper)
    first_gap = np.where(flagged.any(axis=1), np.argmax(flagged, axis=1) + 1, 0)
    first = first_decided_round(lower, upper, margin)
    inside = is_equivalent(lower, upper, margin)
    first_equivalent = np.where(inside.any(axis=1), np.argmax(inside, axis=1) + 1, 0)
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
        "equivalent_by_horizon": {f"{m:g}": _share(is_equivalent(lower, upper, m).any(axis=1))
                                  for m in sorted({margin, *REPORTED_MARGINS})},
        "median_rounds_to_decide": None if math.isinf(median_first) else median_first,
        "median_prompts_used": float(np.median(used)),
        "median_requests_used": float(np.median(used)) * VARIANTS,
        "saving_vs_design": 1.0 - float(np.median(used)) / DESIGN_PROMPTS,
        "cs_seconds": seconds,
        "_first_gap": first_gap,
        "_first_equivalent": first_equivalent,
        "_first_decided": first,
    }


def sized_use(row: dict[str, object], budget: int, fixed: dict[str, dict[str, object]],
              scenario: str) -> dict[str, object]:
    """The base prompts an audit with ``budget`` uses (its decision or the budget), their
    median, and the saving against the fixed design for 10 points and against the one sized
    for this scenario's truth."""
    first = row.pop("_first_decided")
    first_gap = row.pop("_first_gap")
    first_equivalent = row.pop("_first_equivalent")
    assert isinstance(first, np.ndarray) and isinstance(first_gap, np.ndarray)
    assert isinstance(first_equivalent, np.ndarray)
    used = np.where((first > 0) & (first <= budget), first, budget)
    median = float(np.median(used))
    out: dict[str, object] = {
        "budget_base_prompts": budget,
        "gap_flagged_by_budget": _share((first_gap > 0) & (first_gap <= budget)),
        "median_prompts_used_sized": median,
        "median_requests_used_sized": median * VARIANTS,
    }
    for key, reference in (("saving_vs_fixed_gap10", "fixed_gap10"),
                           ("saving_vs_own_fixed_design", OWN_REFERENCE[scenario])):
        size = fixed[reference].get("base_prompts") if reference else None
        out[key] = 1.0 - median / size if isinstance(size, int) else None
    out["own_fixed_design"] = OWN_REFERENCE[scenario]
    # The power the sequential audit reached for this truth by its budget: "no gap" shown for
    # the no-gap scenario, "gap" otherwise. Below POWER, the saving against the design of POWER
    # is an upper bound (the audit would need more to reach that power).
    right = first_equivalent if scenario == "null" else first_gap
    out["own_power_by_budget"] = _share((right > 0) & (right <= budget))
    out["own_power_reached"] = bool(out["own_power_by_budget"]["value"] >= POWER)
    size10 = fixed["fixed_gap10"].get("base_prompts")
    if scenario != "null" and isinstance(size10, int):
        out["gap_share_by_fixed_gap10_size"] = _share((first_gap > 0) & (first_gap <= size10))
    return out


def run_study(audits: int, horizon: int, sigma: float, base: float, grid: int, seed: int,
              fixed_audits: int = 500, permutations: int = 1000, margin: float = MARGIN,
              log=print) -> dict[str, object]:
    tick = time.perf_counter()
    streams = np.random.SeedSequence(seed).spawn(len(SCENARIOS))
    draws = {}
    for (name, gap), stream in zip(SCENARIOS.items(), streams, strict=True):
        draws[name] = draw_audits(culture_etas(base, gap, sigma), audits, horizon, sigma,
                                  np.random.default_rng(stream))
        log(f"drew {name}: {audits} audits x {horizon} base prompts")
    fixed_audits = min(fixed_audits, audits)
    fixed = {name: smallest_design(
        lambda n, name=name: gap_test_power(draws[name][:fixed_audits], n, permutations, seed),
        horizon, step=1, unit="base_prompts", requests_per_unit=VARIANTS)
        for name in ("gap10", "gap30")}
    fixed = {f"fixed_{name}": entry for name, entry in fixed.items()}
    fixed["fixed_equivalence"] = smallest_design(
        lambda n: equivalence_power(draws["null"][:fixed_audits], n, margin), horizon, step=1,
        unit="base_prompts", requests_per_unit=VARIANTS)
    log(f"fixed designs: {json.dumps({k: v.get('base_prompts') for k, v in fixed.items()})}")
    bounds = {}
    for label, (method, options) in BOUNDS.items():
        bounds[label] = {name: run_bound(refused, SCENARIOS[name], method, options, grid, margin)
                         for name, refused in draws.items()}
        first_gap = bounds[label]["gap10"]["_first_gap"]
        assert isinstance(first_gap, np.ndarray)
        budget, reached = sized_budget(first_gap, horizon)
        for name, row in bounds[label].items():
            row.update(sized_use(row, budget, fixed, name), power_reached_in_horizon=reached)
        log(f"{label}: " + json.dumps({n: (r["coverage_all_rounds"]["value"],
                                          r["median_prompts_used"])
                                       for n, r in bounds[label].items()}))
    return {
        "settings": {"audits": audits, "horizon_base_prompts": horizon, "sigma_prompt": sigma,
                     "base_rate": base, "alpha": ALPHA, "margin": margin, "grid": grid,
                     "seed": seed, "cultures": list(CULTURES), "gap_culture": GAP_CULTURE,
                     "design_base_prompts": DESIGN_PROMPTS, "variants": VARIANTS,
                     "fixed_audits": fixed_audits, "permutations": permutations,
                     "power": POWER,
                     "declared_delta": "refusal, max - min over 7 cultures (21 pairs at "
                                       "alpha/21)"},
        "fixed_designs": fixed,
        "bounds": bounds,
        "machine": {"cpu": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__},
        "seconds": time.perf_counter() - tick,
    }


def _pct(share: object) -> str:
    return f"{100 * share['value']:.1f}%" if isinstance(share, dict) else "—"


def _bound_mark(row: dict[str, object]) -> str:
    """"< " before a saving that is an upper bound (the audit's power for its truth stayed
    below POWER by its budget)."""
    bounded = not row["own_power_reached"] and row["saving_vs_own_fixed_design"] is not None
    return "< " if bounded else ""


def _saving(value: object) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, float) else "—"


def markdown(result: dict[str, object], command: str) -> str:
    s = result["settings"]
    fixed = result["fixed_designs"]
    assert isinstance(s, dict) and isinstance(fixed, dict)
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
        f"Fixed designs of the same power ({s['power']:.0%} on the first {s['fixed_audits']} "
        f"audits; for a gap the T2I analysis' culture-row test: between-groups permutation "
        f"within base prompts, unadjusted p < α, {s['permutations']} permutations; for no gap "
        f"its equivalence test at margin {s['margin']}):", "",
        "| reference | base prompts | requests | power there |", "| --- | --- | --- | --- |",
    ]
    for key, name in (("fixed_gap10", "10 pp gap"), ("fixed_gap30", "30 pp gap"),
                      ("fixed_equivalence", f"no gap (equivalence, margin {s['margin']})")):
        entry = fixed[key]
        size = entry.get("base_prompts")
        lines.append(f"| {name} | {size if size is not None else '> horizon'} | "
                     f"{entry.get('requests', '—')} | "
                     f"{_pct({'value': entry['power']}) if 'power' in entry else '—'} |")
    lines += [
        "", "The no-gap design is the T2I analysis' equivalence test (paired TOST per pair of "
        "cultures over base prompts, intersection-union) at the study's margin; its power at "
        "the sizes evaluated: " + ", ".join(
            f"{e['base_prompts']}: {100 * e['power']:.0f}%"
            for e in fixed["fixed_equivalence"]["evaluated"]) + ".", "",
        "Share of no-gap audits whose CS lies inside the margin at some round by the horizon: "
        + "; ".join(f"{label}: " + ", ".join(
            f"±{m}: {_pct(share)}" for m, share in
            scenarios["null"]["equivalent_by_horizon"].items())
            for label, scenarios in result["bounds"].items()) + ".", "",
        "Against the ACRB design (the audit runs until it decides or the design ends):", "",
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
    lines += [
        "", "Against the fixed design of the same power (the audit's budget: the base prompts by "
        "which 80% of the 10 pp audits decided a gap, or the horizon where fewer did). Where "
        "the audit's power for the truth by its budget is below 80%, its saving against the "
        "fixed design of 80% power is an upper bound, marked <: reaching that power would "
        "take more base prompts.", "",
        "| bound | scenario | budget (80% power reached) | flagged by the budget | power for "
        "this truth by the budget (no gap: shown inside the margin) | median base "
        "prompts used | saving vs fixed 10 pp design | saving vs fixed design for this truth | "
        "gap decided by the fixed 10 pp size |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, scenarios in result["bounds"].items():
        for name, row in scenarios.items():
            reached = "yes" if row["power_reached_in_horizon"] else "no"
            lines.append(
                f"| {label} | {name} | {row['budget_base_prompts']} ({reached}) | "
                f"{_pct(row['gap_flagged_by_budget'])} | "
                f"{_pct(row['own_power_by_budget'])} | "
                f"{row['median_prompts_used_sized']:.0f} | "
                f"{_saving(row['saving_vs_fixed_gap10'])} | "
                f"{_bound_mark(row)}"
                f"{_saving(row['saving_vs_own_fixed_design'])} | "
                f"{_pct(row.get('gap_share_by_fixed_gap10_size'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audits", type=int, default=500)
    parser.add_argument("--horizon", type=int, default=300, help="base prompts per audit")
    parser.add_argument("--sigma-prompt", type=float, default=0.8)
    parser.add_argument("--base-rate", type=float, default=0.10)
    parser.add_argument("--grid", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--fixed-audits", type=int, default=500,
                        help="audits the fixed designs' power is measured on")
    parser.add_argument("--permutations", type=int, default=1000,
                        help="permutations of each fixed design's test")
    parser.add_argument("--margin", type=float, default=MARGIN,
                        help="equivalence margin of the declared Δ and of the fixed "
                             "equivalence design (rate units)")
    parser.add_argument("--tiny", action="store_true",
                        help="20 audits x 60 base prompts, 200 permutations")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    audits, horizon = (20, 60) if args.tiny else (args.audits, args.horizon)
    permutations = 200 if args.tiny else args.permutations
    result = run_study(audits, horizon, args.sigma_prompt, args.base_rate, args.grid,
                       args.seed, args.fixed_audits, permutations, args.margin,
                       log=lambda line: print(line, file=sys.stderr))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        command = "python benchmarks/sequential_t2i_study.py " + " ".join(argv or sys.argv[1:])
        args.markdown.write_text(markdown(result, command))
    return result


if __name__ == "__main__":
    main()
