"""Coverage, bias and false-flag rate of the T2I analysis by prompt attribute, by simulation.

Simulates audits at the design of the ACRB T2I prompts (100 base prompts in 9 safety domains x
24 attributes + neutral, one seed) and runs :mod:`acrb.analysis.experiments.attributes` on each:

- ``planted``: the embedded default's planted refusal probabilities (params.yaml,
  ``models.synthetic-t2i``), fixed per request, as the simulated generator draws them;
- ``null-clustered``: no attribute effect, but each base prompt has its own refusal
  propensity (logit-normal, SD 0.8 around the domain's base rate), so the variants of one
  scene are correlated, as they would be for a real model.

Each audit's Δ table is computed twice on the same bootstrap and permutation seeds: as
``analyze`` reports it by default (``default``: per-row intervals by test inversion, the
between-groups row test) and as it did before (``band_range``: max-t bands simultaneous over
the table, the range test). Per scenario it records how often each attribute's interval covers
its true rate; per table, how often each row's interval covers its true Δ (rows with a true
gap and rows with Δ = 0 apart), how often all six cover at once, the mean width and how often
a row with Δ = 0 is flagged; and per row (``rows``) its true Δ, the mean Δ-hat and corrected Δ,
coverage and flag rate under both. Run from the repository root::

    PYTHONPATH=src python benchmarks/t2i_simulation.py --replicates 300 --bootstrap 2000 \
        --permutations 500 --out benchmarks/results/t2i_simulation.json

It writes ``benchmarks/results/t2i_simulation.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from acrb.analysis.estimation.resampling import GroupTest
from acrb.analysis.experiments.attributes import (
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


#: The two ways of computing a Δ table compared: (simultaneous, test) of attribute_disparities.
TABLES: dict[str, tuple[bool, GroupTest]] = {
    "default": (False, "between-groups"),
    "band_range": (True, "range"),
}
_TOLERANCE = 1e-12


def _summary(rows: pd.DataFrame, replicates: int) -> dict[str, object]:
    """One table kind's figures from its rows over every replicate (columns replicate,
    dimension, true_delta, covered, flagged, width)."""
    gap = rows["true_delta"] > _TOLERANCE
    joint = rows.groupby("replicate")["covered"].all()
    return {
        "coverage_rows_with_gap": float(rows.loc[gap, "covered"].mean()) if gap.any() else None,
        "coverage_null_rows": float(rows.loc[~gap, "covered"].mean()) if (~gap).any() else None,
        "joint_coverage": float(joint.mean()),
        "false_flag_rate_per_null_row": (float(rows.loc[~gap, "flagged"].mean())
                                         if (~gap).any() else None),
        "flag_rate_rows_with_gap": float(rows.loc[gap, "flagged"].mean()) if gap.any() else None,
        "mean_width": float(rows["width"].mean()),
        "replicates": replicates,
    }


def run(replicates: int, n_boot: int, n_perm: int, seed: int) -> dict[str, object]:
    frame = design()
    rng = np.random.default_rng(seed)
    planted = planted_probabilities(frame)
    base_logit = np.log(0.08 / 0.92)
    results: dict[str, object] = {}
    for scenario in ("planted", "null-clustered"):
        rate_hits = rate_total = 0
        records: list[dict[str, object]] = []
        started = time.perf_counter()
        for replicate in range(replicates):
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
            covered = ((rates["ci_low"] <= rates["attribute"].map(truth) + _TOLERANCE)
                       & (rates["attribute"].map(truth) <= rates["ci_high"] + _TOLERANCE))
            rate_hits += int(covered.sum())
            rate_total += len(rates)
            table_seed = int(rng.integers(2**31))
            families = dict(attribute_families(list(truth.index)))
            for kind, (simultaneous, test) in TABLES.items():
                gaps = attribute_disparities(data, "hard_refusal", 0.95, 0.05, n_boot, n_perm,
                                             table_seed, simultaneous, test=test)
                for row in gaps.to_dict("records"):
                    values = truth.reindex(families[row["dimension"]])
                    true_delta = float(values.max() - values.min())
                    records.append({
                        "kind": kind, "replicate": replicate, "dimension": row["dimension"],
                        "true_delta": true_delta, "delta": row["delta"],
                        "corrected": row["delta_corrected"],
                        "covered": bool(row["ci_low"] - _TOLERANCE <= true_delta
                                        <= row["ci_high"] + _TOLERANCE),
                        "flagged": bool(row["flagged"]),
                        "width": row["ci_high"] - row["ci_low"],
                        # The per-row interval's duality with its row test (checked, not assumed).
                        "excludes_zero": bool(row["ci_low"] > 0),
                        "rejects": bool(row["p_value"] < 0.05),
                    })
        table = pd.DataFrame(records)
        default = table[table["kind"] == "default"]
        band = table[table["kind"] == "band_range"]
        rows = {}
        for dimension, block in default.groupby("dimension", sort=False):
            other = band[band["dimension"] == dimension]
            rows[str(dimension)] = {
                "true_delta_mean": float(block["true_delta"].mean()),
                "mean_delta": float(block["delta"].mean()),
                "mean_corrected": float(block["corrected"].mean()),
                "per_row_coverage": float(block["covered"].mean()),
                "band_coverage": float(other["covered"].mean()),
                "flag_rate": float(block["flagged"].mean()),
                "flag_rate_range_test": float(other["flagged"].mean()),
                "mean_width_per_row": float(block["width"].mean()),
                "mean_width_band": float(other["width"].mean()),
            }
        null = default["true_delta"] <= _TOLERANCE
        results[scenario] = {
            "replicates": replicates,
            "rate_interval_coverage": rate_hits / rate_total,
            "default": {"interval": "per-row test inversion", "test": "between-groups",
                        **_summary(default, replicates)},
            "band_range": {"interval": "max-t band (simultaneous)", "test": "range",
                           **_summary(band, replicates)},
            # The keys of earlier versions of this file, for comparison (the band and range
            # test, which analyze reported before the per-row interval was its default).
            "delta_table_joint_coverage": float(
                band.groupby("replicate")["covered"].all().mean()),
            "false_flag_rate_per_null_row": (float(band.loc[null.to_numpy(), "flagged"].mean())
                                             if null.any() else None),
            "null_rows": int(null.sum()),
            "per_row_interval_excludes_zero_exactly_when_test_rejects": bool(
                (default["excludes_zero"] == default["rejects"]).all()),
            "rows": rows,
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(scenario, json.dumps(results[scenario], indent=1), flush=True)
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
