"""Do judge-corrected Δ intervals cover the truth when the judge errs more for one group?

Simulates many reviews of two source groups with a planted judge error that differs by group:
each output truly shows the outcome (soft erasure, say) with the group's true rate; the judge
reports it when it is there with probability 1 − ``miss`` (the same for both groups) and,
when it is not, falsely with the group's false-positive rate (0.02 for group A, 0.15 for B by
default). People label a random sample of each group's outputs without error (PPI's gold
standard), the judge labels all. Every run builds the labelled frame and calls
:func:`acrb.analysis.agreement.corrected.corrected_deltas` (the function the review stage calls) for
Δ = rate(A) − rate(B), and records whether each estimator's 95% interval covers the true Δ and
how wide it is:

- judge-only: every output's judge label, Newcombe interval: biased by the planted error;
- human-only: the labelled outputs alone, Newcombe interval: unbiased, wide;
- PPI: judge labels corrected by the labelled sample (power-tuned), sum-of-variances interval.

Usage::

    python benchmarks/ppi_coverage.py --runs 500 --out benchmarks/results/ppi_coverage.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from acrb.analysis.agreement.corrected import ESTIMATORS, corrected_deltas

#: The two groups (race labels, so the real frame code paths are used): A, then B.
GROUP_A, GROUP_B = "White", "Black"


@dataclass(frozen=True)
class Design:
    """One simulated review: per group, ``judged`` outputs of which ``labelled`` are rated."""

    judged: int = 2000
    labelled: int = 150
    rate_a: float = 0.20
    rate_b: float = 0.25
    false_positive_a: float = 0.02
    false_positive_b: float = 0.15
    miss: float = 0.05
    confidence: float = 0.95

    @property
    def true_delta(self) -> float:
        return self.rate_a - self.rate_b


def simulated_frame(design: Design, rng: np.random.Generator) -> pd.DataFrame:
    """One review's labelled frame (:func:`acrb.analysis.agreement.corrected.labelled_frame`
    shape)."""
    parts = []
    for group, rate, false_positive in ((GROUP_A, design.rate_a, design.false_positive_a),
                                        (GROUP_B, design.rate_b, design.false_positive_b)):
        truth = rng.random(design.judged) < rate
        says = np.where(truth, rng.random(design.judged) >= design.miss,
                        rng.random(design.judged) < false_positive)
        human = pd.array([pd.NA] * design.judged, dtype="boolean")
        sampled = rng.choice(design.judged, size=design.labelled, replace=False)
        human[sampled] = truth[sampled]
        parts.append(pd.DataFrame({
            "request_id": [f"{group}-{i}" for i in range(design.judged)],
            "race": group, "gender": "Female", "age": "20s", "judge": says, "human": human}))
    return pd.concat(parts, ignore_index=True)


def simulate(runs: int, design: Design = Design(), seed: int = 0) -> dict:
    """Coverage of the true Δ and mean interval width per estimator over ``runs`` reviews,
    and the mean Δ estimate (bias = mean − truth)."""
    rng = np.random.default_rng(seed)
    covered = {e: 0 for e in ESTIMATORS}
    widths: dict[str, list[float]] = {e: [] for e in ESTIMATORS}
    estimates: dict[str, list[float]] = {e: [] for e in ESTIMATORS}
    for _ in range(runs):
        table = corrected_deltas(simulated_frame(design, rng), "soft_erasure", "race",
                                 pair=(GROUP_A, GROUP_B), confidence=design.confidence)
        for row in table.to_dict("records"):
            e = row["estimator"]
            covered[e] += int(row["ci_low"] <= design.true_delta <= row["ci_high"])
            widths[e].append(row["ci_high"] - row["ci_low"])
            estimates[e].append(row["delta"])
    return {
        "runs": runs,
        "seed": seed,
        "design": asdict(design),
        "true_delta": design.true_delta,
        "coverage": {e: covered[e] / runs for e in ESTIMATORS},
        "mean_width": {e: float(np.mean(widths[e])) for e in ESTIMATORS},
        "mean_delta": {e: float(np.mean(estimates[e])) for e in ESTIMATORS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--judged", type=int, default=Design.judged,
                        help="judged outputs per group")
    parser.add_argument("--labelled", type=int, default=Design.labelled,
                        help="outputs per group people label")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ppi_coverage.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    result = simulate(args.runs, Design(judged=args.judged, labelled=args.labelled),
                      seed=args.seed)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("coverage", "mean_width", "mean_delta",
                                             "true_delta", "seconds")}, indent=2))


if __name__ == "__main__":
    main()
