"""Coverage and false-flag rate of the T2I analysis by prompt attribute, by simulation.

Simulates audits at the design of the ACRB T2I prompts (100 base prompts in 9 safety domains x
24 attributes + neutral, one seed) and runs :mod:`acrb.analysis.attributes` on each:

- ``planted``: the embedded default's planted refusal probabilities (params.yaml,
  ``models.synthetic-t2i``), fixed per request, as the simulated generator draws them;
- ``null-clustered``: no attribute effect, but each base prompt has its own refusal
  propensity (logit-normal, SD 0.8 around the domain's base rate), so the variants of one
  scene are correlated, as they would be for a real model.

Per scenario it records how often each attribute's interval covers its true rate, how often
every Δ interval of the table covers its true Δ at once (they are simultaneous), and how often
a row is flagged where the true Δ is 0. Run from the repository root::

    PYTHONPATH=src python benchmarks/t2i_simulation.py --replicates 200

It writes ``benchmarks/results/t2i_simulation.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from acrb.analysis.attributes import (
    ALL_ATTRIBUTES,
    attribute_dimension,
    attribute_disparities,
    attribute_families,
    attribute_rates,
)
from acrb.models.synthetic_t2i import SyntheticGeneratorConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "acrb" / "prompts" / "data"


def design() -> pd.DataFrame:
    """One row per T2I prompt of the packaged ACRB data: base_id, category, attribute."""
    base = yaml.safe_load((DATA / "base_prompts.yaml").read_text())["prompts"]
    dimensions = yaml.safe_load((DATA / "attributes.yaml").read_text())["dimensions"]
    attributes = ["neutral"] + [f"{d}:{a['id']}" for d, values in dimensions.items()
                                for a in values]
    return pd.DataFrame([{"base_id": p["id"], "category": p["domain"], "attribute": a,
                          "prompt_id": f"{p['id']}-{a}"} for p in base for a in attributes])


def planted_probabilities(frame: pd.DataFrame) -> np.ndarray:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    config = SyntheticGeneratorConfig.model_validate(params["models"]["synthetic-t2i"]["config"])
    return np.array([config.refusal.probability(c, a)
                     for c, a in zip(frame["category"], frame["attribute"], strict=True)])


def true_rates(frame: pd.DataFrame, p: np.ndarray) -> pd.Series:
    return pd.Series(p, index=frame.index).groupby(frame["attribute"]).mean()


def run(replicates: int, n_boot: int, n_perm: int, seed: int) -> dict[str, object]:
    frame = design()
    rng = np.random.default_rng(seed)
    planted = planted_probabilities(frame)
    base_logit = np.log(0.08 / 0.92)
    results: dict[str, object] = {}
    for scenario in ("planted", "null-clustered"):
        rate_hits = rate_total = joint_hits = false_flags = null_rows = 0
        started = time.perf_counter()
        for _ in range(replicates):
            if scenario == "planted":
                p = planted
            else:
                effect = pd.Series(rng.normal(0.0, 0.8, frame["base_id"].nunique()),
                                   index=frame["base_id"].unique())
                p = 1 / (1 + np.exp(-(base_logit + frame["base_id"].map(effect).to_numpy())))
            truth = true_rates(frame, p)
            outcome = rng.random(len(frame)) < p
            data = frame.assign(status="ok", hard_refusal=pd.array(outcome, dtype="boolean"))
            rates = attribute_rates(data, "hard_refusal", 0.95, n_boot,
                                    int(rng.integers(2**31)))
            covered = ((rates["ci_low"] <= rates["attribute"].map(truth) + 1e-12)
                       & (rates["attribute"].map(truth) <= rates["ci_high"] + 1e-12))
            rate_hits += int(covered.sum())
            rate_total += len(rates)
            gaps = attribute_disparities(data, "hard_refusal", 0.95, 0.05, n_boot, n_perm,
                                         int(rng.integers(2**31)))
            families = dict(attribute_families(list(truth.index)))
            all_in = True
            for row in gaps.to_dict("records"):
                values = truth.reindex(families[row["dimension"]])
                true_delta = float(values.max() - values.min())
                all_in &= row["ci_low"] - 1e-12 <= true_delta <= row["ci_high"] + 1e-12
                if true_delta < 1e-12:
                    null_rows += 1
                    false_flags += int(row["flagged"])
            joint_hits += int(all_in)
        results[scenario] = {
            "replicates": replicates,
            "rate_interval_coverage": rate_hits / rate_total,
            "delta_table_joint_coverage": joint_hits / replicates,
            "false_flag_rate_per_null_row": false_flags / null_rows if null_rows else None,
            "null_rows": null_rows,
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(scenario, results[scenario], flush=True)
    results["design"] = {"prompts": len(frame), "base_prompts": int(frame["base_id"].nunique()),
                         "attributes": int(frame["attribute"].nunique()),
                         "dimensions": sorted({attribute_dimension(a)
                                               for a in frame["attribute"]} - {"neutral"}),
                         "delta_rows": [ALL_ATTRIBUTES, *sorted(
                             {attribute_dimension(a) for a in frame["attribute"]} - {"neutral"})],
                         "n_boot": n_boot, "n_perm": n_perm, "seed": seed}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--permutations", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "t2i_simulation.json")
    args = parser.parse_args()
    results = run(args.replicates, args.bootstrap, args.permutations, args.seed)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
