"""The hypotheses table: each declared hypothesis with its test, estimate, interval and verdict.

Hypotheses are declared in params (``analyze.hypotheses``; the default declares H1-H6 of the
seed study). Each names a test:

- ``disparity``: the row of the cluster-robust disparity table for its outcome, category and
  dimension (Δ, the bias-corrected Δ and the interval of Δ; the p-value of the row's
  permutation test over sources, by default of the between-group statistic, the most powerful
  valid one in the simulation study: ``docs/statistics.md#the-row-test``);
- ``equivalence``: a "no bias" claim, tested by TOST on every pair of groups
  (intersection-union) with variances inflated by the design effect of clustering within
  sources; a non-significant disparity is never read as equivalence;
- ``scs``: the stereotype congruence score with its cluster-bootstrap interval and a one-sided
  bootstrap p-value for SCS > 0;
- ``model_interaction``: the GEE test (robust score test, clustered on source image) of model
  x group interaction across all models.

All p-values of the table form one family, corrected by Holm's method at ``analyze.alpha``:
these are the audit's confirmatory claims, apart from the screening of every cell of the
disparity tables (Holm over each table).
Next to every hypothesis of a gap that is not supported, the table gives the minimum gap the
design could have detected with ``analyze.power``, so "no significant gap" is read with its
power.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import pandas as pd

from acrb.analysis.estimation.power import design_effect, detectable_gap
from acrb.analysis.experiments.congruence import scs
from acrb.analysis.frame import ALL_CATEGORIES, usable_rows
from acrb.analysis.tests.equivalence import tost_delta
from acrb.analysis.tests.gee import model_interaction_test
from acrb.analysis.tests.pvalues import adjust
from acrb.config import AnalyzeParams, HypothesisSpec
from acrb.demographics import SOURCE_DIMENSIONS

HYPOTHESIS_COLUMNS = (
    "hypothesis", "claim", "model", "test", "outcome", "category", "dimension", "estimate",
    "estimate_label", "ci_low", "ci_high", "interval_label", "p_value", "p_adjusted",
    "supported", "verdict", "mde", "note",
)


def _pp(value: float) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.1f} pp"


def _subset(frame: pd.DataFrame, category: str | None) -> pd.DataFrame:
    if category is None:
        return frame
    return frame.loc[frame["category"].astype(str) == str(category)]


def _gap_row(gaps: pd.DataFrame, spec: HypothesisSpec) -> pd.Series:
    category = ALL_CATEGORIES if spec.category is None else spec.category
    match = gaps.loc[(gaps["outcome"] == spec.outcome) & (gaps["category"] == category)
                     & (gaps["dimension"] == spec.dimension)]
    if len(match) != 1:
        raise ValueError(f"no disparity row for {spec.outcome} / {category} / {spec.dimension}")
    return match.iloc[0]


def _row(name: str, spec: HypothesisSpec, model: str, **values: Any) -> dict[str, Any]:
    base = {
        "hypothesis": name, "claim": spec.claim, "model": model, "test": spec.test,
        "outcome": spec.outcome, "category": spec.category or ALL_CATEGORIES,
        "dimension": spec.dimension,
        "estimate": float("nan"), "estimate_label": "—", "ci_low": float("nan"),
        "ci_high": float("nan"), "interval_label": "—", "p_value": float("nan"),
        "mde": float("nan"), "note": "",
    }
    base.update(values)
    return base


def _disparity(name: str, spec: HypothesisSpec, model: str, frame: pd.DataFrame,
               gaps: pd.DataFrame, cfg: AnalyzeParams) -> dict[str, Any]:
    row = _gap_row(gaps, spec)
    return _row(
        name, spec, model, estimate=float(row["delta"]),
        estimate_label=(f"Δ {_pp(row['delta'])} ({row['max_group']} vs {row['min_group']}); "
                        f"corrected {_pp(row.get('delta_corrected', float('nan')))}"),
        ci_low=float(row["ci_low"]), ci_high=float(row["ci_high"]),
        interval_label=f"[{_pp(row['ci_low'])}, {_pp(row['ci_high'])}]",
        p_value=float(row["p_value"]),
        mde=detectable_gap(_subset(frame, spec.category), spec.outcome, spec.dimension,
                           cfg.alpha, cfg.power),
        note=f"cluster bootstrap interval; {row['method'].split('/')[-1]} over sources",
    )


def _equivalence(name: str, spec: HypothesisSpec, model: str, frame: pd.DataFrame,
                 gaps: pd.DataFrame, cfg: AnalyzeParams) -> dict[str, Any]:
    margin = spec.margin if spec.margin is not None else cfg.equivalence_margin
    rows = _subset(frame, spec.category)
    deff = design_effect(usable_rows(rows), spec.outcome, spec.dimension).deff
    result = tost_delta(rows, spec.outcome, spec.dimension, margin=margin, alpha=cfg.alpha,
                        deff=deff)
    row = _gap_row(gaps, spec)
    return _row(
        name, spec, model, estimate=float(result.delta),
        estimate_label=f"Δ {_pp(result.delta)} (margin {_pp(margin)})",
        ci_low=float(row["ci_low"]), ci_high=float(row["ci_high"]),
        interval_label=f"[{_pp(row['ci_low'])}, {_pp(row['ci_high'])}]",
        p_value=float(result.p_value),
        note=f"TOST on every pair of groups, design effect {deff:.2f}"
        + (f"; {result.reason}" if result.reason else ""),
        margin=margin,
    )


def _scs(name: str, spec: HypothesisSpec, model: str, frame: pd.DataFrame,
         cfg: AnalyzeParams) -> dict[str, Any]:
    if spec.category is None:
        raise ValueError(f"hypothesis {name}: an scs test needs a category")
    result = scs(frame, spec.outcome, spec.category, cfg.bootstrap, cfg.seed, cfg.confidence,
                 resample=cfg.resample)
    if not result.defined:
        return _row(name, spec, model, estimate_label="undefined", note=result.reason)
    return _row(
        name, spec, model, estimate=result.estimate,
        estimate_label=(f"SCS {result.estimate:+.2f} (R incongruent "
                        f"{_pp(result.r_incongruent)}, congruent {_pp(result.r_congruent)}, "
                        f"baseline {_pp(result.r_baseline)})"),
        ci_low=result.ci_low, ci_high=result.ci_high,
        interval_label=f"[{result.ci_low:+.2f}, {result.ci_high:+.2f}]",
        p_value=float(result.p_value),
        note=("two-way cluster bootstrap" if cfg.resample == "two-way"
              else f"cluster bootstrap over {cfg.resample}")
        + (f"; {result.reason}" if result.reason else ""),
    )


def _interaction(name: str, spec: HypothesisSpec, frames: Mapping[str, pd.DataFrame]
                 ) -> dict[str, Any]:
    models = ", ".join(frames)
    if len(frames) < 2:
        return _row(name, spec, models, note="needs at least two models")
    pooled = pd.concat([f.assign(model=m) for m, f in frames.items()], ignore_index=True)
    result = model_interaction_test(_subset(pooled, spec.category), spec.outcome,
                                    spec.dimension)
    label = (f"χ² {result.statistic:.1f}, df {result.df:.0f}"
             if math.isfinite(result.statistic) else "—")
    return _row(name, spec, models, estimate=float(result.statistic), estimate_label=label,
                p_value=float(result.p_value),
                note=result.method + (f"; {result.reason}" if result.reason else ""))


def _verdict(row: Mapping[Hashable, Any], alpha: float) -> tuple[bool | None, str]:
    p = row["p_adjusted"]
    if not math.isfinite(p):
        return None, "not testable" + (f" ({row['note']})" if row["note"] else "")
    significant = p < alpha
    test = row["test"]
    if test == "equivalence":
        margin = _pp(row.get("margin", float("nan")))
        if significant:
            return True, f"supported: every group gap is below {margin}"
        return False, f"not shown: a gap of {margin} or more cannot be excluded"
    if test == "scs":
        if significant:
            return True, "supported: SCS > 0"
        return False, "not supported: SCS not significantly above 0"
    if significant:
        return True, "supported"
    detail = f" (detectable gap at this design: {_pp(row['mde'])})" if math.isfinite(
        row["mde"]) else ""
    return False, "not supported: no significant difference" + detail


def evaluate_hypotheses(frames: Mapping[str, pd.DataFrame], gaps: Mapping[str, pd.DataFrame],
                    cfg: AnalyzeParams) -> pd.DataFrame:
    """Test every hypothesis of ``cfg.hypotheses`` on every model (``frames`` and ``gaps``:
    each model's analysis frame and cluster-robust disparity table), Holm over the table."""
    rows: list[dict[str, Any]] = []
    for name, spec in cfg.hypotheses.items():
        if spec.dimension not in SOURCE_DIMENSIONS:
            raise ValueError(f"hypothesis {name}: unknown dimension {spec.dimension}")
        if spec.test == "model_interaction":
            rows.append(_interaction(name, spec, frames))
            continue
        for model, frame in frames.items():
            if spec.category is not None and spec.category not in set(frame["category"]):
                # e.g. hypotheses about catalog categories on an audit of the ACRB prompt set
                rows.append(_row(name, spec, model,
                                 note=f"no requests of category {spec.category}"))
                continue
            if spec.test == "disparity":
                rows.append(_disparity(name, spec, model, frame, gaps[model], cfg))
            elif spec.test == "equivalence":
                rows.append(_equivalence(name, spec, model, frame, gaps[model], cfg))
            else:
                rows.append(_scs(name, spec, model, frame, cfg))
    if not rows:  # no hypotheses declared: an empty table with the same columns
        empty = pd.DataFrame(columns=list(HYPOTHESIS_COLUMNS))
        empty["supported"] = pd.array([], dtype="boolean")
        return empty
    # Rows carry more than the table shows (an equivalence row's margin, read by _verdict).
    table = pd.DataFrame(rows)
    adjusted = adjust(table["p_value"].to_numpy(dtype=float), "holm")
    table["p_adjusted"] = adjusted
    verdicts = [_verdict(row, cfg.alpha) for row in table.to_dict("records")]
    table["supported"] = pd.array([v[0] for v in verdicts], dtype="boolean")
    table["verdict"] = [v[1] for v in verdicts]
    return table[list(HYPOTHESIS_COLUMNS)]
