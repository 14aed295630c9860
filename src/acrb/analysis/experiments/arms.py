"""The feature-prompt arm against the plain arm: paired tests, group rates and the race gap.

The feature arm repeats a plain request with the source's feature prompt before the
instruction, everything else identical (:mod:`acrb.stages.plan`). A **pair** is one (model,
source, prompt, seed) cell whose two requests were both answered (status ``ok`` or
``refused``); an outcome or axis counts the pairs where it was observed in both arms (a
conditional outcome such as erasure is unobserved on a refused request). Comparing the arms
pair by pair removes what the cell contributes (face, prompt, seed) from the comparison.

- **Judge axes** (``axes.csv``): the change in mean ensemble score, feature - none, and the
  Wilcoxon signed-rank test of the paired differences (Wilcoxon 1945; ``scipy.stats.wilcoxon``,
  two-sided). Zero differences (pairs whose score the arm did not change) are dropped before
  ranking, Wilcoxon's own rule (``zero_method="wilcox"``); ``n_pairs`` still counts them. With
  no non-zero difference there is nothing to rank: statistic and p-value are NaN.
- **Outcomes** (``mcnemar.csv``): the exact McNemar test (McNemar 1947; the binomial test of the
  discordant pairs, ``statsmodels.stats.contingency_tables.mcnemar(exact=True)``) of the
  2 x 2 table of pairs by outcome in each arm.
- **Group rates** (``group_rates.csv``): per source group, the outcome's rate in each arm over
  the same pairs and its change, with a percentile interval from a bootstrap that resamples
  **sources** within their group (every pair of a drawn source comes along: the same face
  answers many prompts, so its pairs are not independent; Davison & Hinkley 1997, ch. 3).
- **The gap** (``gap.csv``): Δ = max - min of the group rates in each arm, and the narrowing
  Δ_none - Δ_feature (> 0: the feature arm narrows the gap), with a percentile interval from
  the same source bootstrap, and a two-sided p-value from a source-clustered randomisation
  test: under the null that the arm changes nothing, the two arm labels of a source's pairs are
  exchangeable, so each permutation swaps the arms of every pair of a random half of the
  sources (all of a source's pairs together), and p = (1 + #{|narrowing*| >= |narrowing|}) /
  (1 + permutations) (Phipson & Smyth 2010).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.resampling import bootstrap_weights, pooled_rate
from acrb.analysis.frame import USABLE_STATUSES
from acrb.analysis.inputs import FEATURE_ARM, PLAIN_ARM
from acrb.analysis.outcomes import OUTCOMES
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.records import SCORE_AXES
from acrb.storage import content_hash

#: The columns of each table (docs: the schemas of data/analysis/arms/).
AXES_COLUMNS = ["model", "axis", "n_pairs", "mean_none", "mean_feature", "change", "statistic",
                "p_value"]
MCNEMAR_COLUMNS = ["model", "outcome", "n_pairs", "both", "none_only", "feature_only",
                   "neither", "rate_none", "rate_feature", "p_value"]
GROUP_RATE_COLUMNS = ["model", "outcome", "dimension", "group", "n_pairs", "rate_none",
                      "rate_feature", "change", "low", "high", "confidence"]
GAP_COLUMNS = ["model", "outcome", "dimension", "delta_none", "delta_feature", "narrowing",
               "low", "high", "p_value", "confidence"]
#: The keys of a pair: one cell of the audit, answered in both arms.
PAIR_KEYS = ["source_id", "prompt_id", "seed"]


@dataclass(frozen=True)
class ArmTables:
    """The four tables of the paired comparison, one row per model and axis / outcome / group."""

    axes: pd.DataFrame
    mcnemar: pd.DataFrame
    group_rates: pd.DataFrame
    gap: pd.DataFrame


def has_feature_arm(frame: pd.DataFrame) -> bool:
    """Whether an analysis frame (with its ``arm`` column) holds feature-arm requests."""
    return "arm" in frame.columns and bool((frame["arm"] == FEATURE_ARM).any())


def pair_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per pair of ``frame`` (all arms of one model; ``arm`` column): the cell's keys
    and source groups, then each outcome and judge axis as ``<column>_none`` and
    ``<column>_feature``. Requests of other experiments than the audit are left out."""
    if "experiment" in frame.columns:
        frame = frame[frame["experiment"] == "audit"]
    answered = frame[frame["status"].isin(USABLE_STATUSES)]
    measured = [c for c in (*OUTCOMES, *SCORE_AXES) if c in frame.columns]
    groups = [d for d in SOURCE_DIMENSIONS if d in frame.columns]
    plain = answered[answered["arm"] == PLAIN_ARM][[*PAIR_KEYS, *groups, *measured]]
    feature = answered[answered["arm"] == FEATURE_ARM][[*PAIR_KEYS, *measured]]
    return plain.merge(feature, on=PAIR_KEYS, suffixes=("_none", "_feature"),
                       validate="one_to_one")


def axis_rows(pairs: pd.DataFrame, model: str) -> list[dict[str, object]]:
    """Per judge axis: the paired change in mean ensemble score and its Wilcoxon test."""
    from scipy import stats

    rows: list[dict[str, object]] = []
    for axis in SCORE_AXES:
        if f"{axis}_none" not in pairs.columns:
            continue
        none = pd.to_numeric(pairs[f"{axis}_none"], errors="coerce").to_numpy(dtype=float)
        feature = pd.to_numeric(pairs[f"{axis}_feature"], errors="coerce").to_numpy(dtype=float)
        both = np.isfinite(none) & np.isfinite(feature)
        none, feature = none[both], feature[both]
        statistic = p_value = float("nan")
        if np.any(feature != none):
            test = stats.wilcoxon(feature, none, zero_method="wilcox")
            statistic, p_value = float(test.statistic), float(test.pvalue)
        mean_none = float(none.mean()) if len(none) else float("nan")
        mean_feature = float(feature.mean()) if len(feature) else float("nan")
        rows.append({"model": model, "axis": axis, "n_pairs": int(both.sum()),
                     "mean_none": mean_none, "mean_feature": mean_feature,
                     "change": mean_feature - mean_none, "statistic": statistic,
                     "p_value": p_value})
    return rows


def _observed(pairs: pd.DataFrame, outcome: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The pairs where ``outcome`` was observed in both arms, and its two boolean columns."""
    none, feature = pairs[f"{outcome}_none"], pairs[f"{outcome}_feature"]
    both = (none.notna() & feature.notna()).to_numpy()
    return (pairs.loc[both], none[both].astype(bool).to_numpy(),
            feature[both].astype(bool).to_numpy())


def outcome_rows(pairs: pd.DataFrame, model: str) -> list[dict[str, object]]:
    """Per outcome: the 2 x 2 table of pairs by outcome in each arm and the exact McNemar test."""
    from statsmodels.stats.contingency_tables import mcnemar

    rows: list[dict[str, object]] = []
    for outcome in OUTCOMES:
        if f"{outcome}_none" not in pairs.columns:
            continue
        _, none, feature = _observed(pairs, outcome)
        both, none_only = int(np.sum(none & feature)), int(np.sum(none & ~feature))
        feature_only, neither = int(np.sum(~none & feature)), int(np.sum(~none & ~feature))
        n = len(none)
        p_value = (float(mcnemar([[both, none_only], [feature_only, neither]],
                                 exact=True).pvalue) if n else float("nan"))
        rows.append({"model": model, "outcome": outcome, "n_pairs": n, "both": both,
                     "none_only": none_only, "feature_only": feature_only, "neither": neither,
                     "rate_none": (both + none_only) / n if n else float("nan"),
                     "rate_feature": (both + feature_only) / n if n else float("nan"),
                     "p_value": p_value})
    return rows


@dataclass(frozen=True)
class _SourceCounts:
    """Per source (ordered by group): pairs observed and outcome counts in each arm."""

    groups: tuple[str, ...]
    group_index: np.ndarray
    n: np.ndarray
    k_none: np.ndarray
    k_feature: np.ndarray

    def rates(self, weights: np.ndarray, k: np.ndarray) -> np.ndarray:
        """(B, G) pooled group rates with source ``weights`` (B, S)."""
        onehot = np.eye(len(self.groups))[self.group_index]
        return pooled_rate((weights * k) @ onehot, (weights * self.n) @ onehot)


def _source_counts(pairs: pd.DataFrame, outcome: str, dimension: str) -> _SourceCounts:
    observed, none, feature = _observed(pairs, outcome)
    per_source = (pd.DataFrame({"source_id": observed["source_id"].to_numpy(),
                                "group": observed[dimension].astype(str).to_numpy(),
                                "n": 1, "k_none": none.astype(int),
                                "k_feature": feature.astype(int)})
                  .groupby(["group", "source_id"], sort=True).sum().reset_index())
    order = {g: i for i, g in enumerate(SOURCE_DIMENSIONS[dimension])}
    groups = tuple(sorted(per_source["group"].unique(), key=lambda g: (order.get(g, 99), g)))
    index = per_source["group"].map({g: i for i, g in enumerate(groups)}).to_numpy(dtype=int)
    sort = np.argsort(index, kind="stable")
    return _SourceCounts(groups, index[sort], per_source["n"].to_numpy(dtype=float)[sort],
                         per_source["k_none"].to_numpy(dtype=float)[sort],
                         per_source["k_feature"].to_numpy(dtype=float)[sort])


def _gap(rates: np.ndarray) -> np.ndarray:
    """max - min over groups (last axis), NaN when a replicate lacks a group."""
    return np.max(rates, axis=-1) - np.min(rates, axis=-1)


def _percentile(values: np.ndarray, confidence: float) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if len(finite) < 2:
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2
    low, high = np.quantile(finite, [tail, 1 - tail])
    return float(low), float(high)


def group_rows(pairs: pd.DataFrame, model: str, outcome: str, dimension: str, *,
               confidence: float, n_boot: int, n_perm: int, seed: int
               ) -> tuple[list[dict[str, object]], dict[str, object] | None]:
    """One outcome and source dimension: each group's rate in both arms and its change with a
    source-bootstrap interval, and the gap row (Δ per arm, narrowing, interval, randomisation
    p-value); the gap row is None with fewer than two groups."""
    counts = _source_counts(pairs, outcome, dimension)
    if not counts.groups:
        return [], None
    # Named streams: a table's numbers do not depend on which other tables were computed.
    rng = np.random.default_rng([seed, int(content_hash([model, outcome, dimension], 8), 16)])
    ones = np.ones((1, len(counts.n)))
    rate_none, rate_feature = counts.rates(ones, counts.k_none)[0], counts.rates(
        ones, counts.k_feature)[0]
    weights, _ = bootstrap_weights(rng, counts.group_index, np.zeros(1, dtype=int), n_boot,
                                   "sources")
    boot_none, boot_feature = counts.rates(weights, counts.k_none), counts.rates(
        weights, counts.k_feature)
    n_group = np.bincount(counts.group_index, counts.n, minlength=len(counts.groups))
    rows: list[dict[str, object]] = []
    for g, group in enumerate(counts.groups):
        low, high = _percentile(boot_feature[:, g] - boot_none[:, g], confidence)
        rows.append({"model": model, "outcome": outcome, "dimension": dimension,
                     "group": group, "n_pairs": int(n_group[g]),
                     "rate_none": float(rate_none[g]), "rate_feature": float(rate_feature[g]),
                     "change": float(rate_feature[g] - rate_none[g]), "low": low, "high": high,
                     "confidence": confidence})
    if len(counts.groups) < 2:
        return rows, None
    delta_none, delta_feature = float(_gap(rate_none)), float(_gap(rate_feature))
    narrowing = delta_none - delta_feature
    low, high = _percentile(_gap(boot_none) - _gap(boot_feature), confidence)
    return rows, {"model": model, "outcome": outcome, "dimension": dimension,
                  "delta_none": delta_none, "delta_feature": delta_feature,
                  "narrowing": narrowing, "low": low, "high": high,
                  "p_value": narrowing_p_value(counts, narrowing, n_perm, rng),
                  "confidence": confidence}


def narrowing_p_value(counts: _SourceCounts, narrowing: float, n_perm: int,
                      rng: np.random.Generator) -> float:
    """Two-sided p-value of the narrowing under the null that the arm changes nothing: the arm
    labels of each source's pairs are swapped together with probability 1/2 (see the module
    docstring)."""
    swap = rng.random((n_perm, len(counts.n))) < 0.5
    moved = counts.k_feature - counts.k_none
    k_none = counts.k_none + swap * moved
    k_feature = counts.k_feature - swap * moved
    ones = np.ones_like(k_none)
    onehot = np.eye(len(counts.groups))[counts.group_index]
    n = (ones * counts.n) @ onehot
    permuted = _gap(pooled_rate(k_none @ onehot, n)) - _gap(pooled_rate(k_feature @ onehot, n))
    extreme = int(np.sum(np.abs(permuted) >= abs(narrowing) - 1e-12))
    return (1 + extreme) / (1 + n_perm)


def compare_arms(frames: Mapping[str, pd.DataFrame], *, confidence: float = 0.95,
                 n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
                 n_perm: int = defaults.PERMUTATIONS, seed: int = defaults.SEED,
                 dimensions: Sequence[str] = ("race",)) -> ArmTables:
    """The paired comparison of the feature arm with the plain arm for every model in
    ``frames`` (model -> analysis frame of all its arms, with ``arm``; see the module
    docstring); group rates and gaps for each source dimension of ``dimensions``."""
    axes: list[dict[str, object]] = []
    outcomes: list[dict[str, object]] = []
    groups: list[dict[str, object]] = []
    gaps: list[dict[str, object]] = []
    for model, frame in frames.items():
        pairs = pair_frame(frame)
        axes += axis_rows(pairs, model)
        outcomes += outcome_rows(pairs, model)
        for outcome in OUTCOMES:
            if f"{outcome}_none" not in pairs.columns:
                continue
            for dimension in dimensions:
                rows, gap = group_rows(pairs, model, outcome, dimension, confidence=confidence,
                                       n_boot=n_boot, n_perm=n_perm, seed=seed)
                groups += rows
                if gap is not None:
                    gaps.append(gap)
    return ArmTables(axes=pd.DataFrame(axes, columns=AXES_COLUMNS),
                     mcnemar=pd.DataFrame(outcomes, columns=MCNEMAR_COLUMNS),
                     group_rates=pd.DataFrame(groups, columns=GROUP_RATE_COLUMNS),
                     gap=pd.DataFrame(gaps, columns=GAP_COLUMNS))


def arm_metrics(tables: ArmTables, model: str) -> dict[str, float]:
    """Metrics of one model (MLflow, data/analysis/<model>/metrics.csv): pairs, the narrowing
    of each outcome's gap with its interval and p-value, and the change in each judge axis."""
    metrics: dict[str, float] = {}
    outcomes = tables.mcnemar[tables.mcnemar["model"] == model]
    if len(outcomes):
        metrics["feature_arm.pairs"] = float(outcomes["n_pairs"].max())
    for row in tables.gap[tables.gap["model"] == model].to_dict("records"):
        name = f"feature_arm.narrowing.{row['outcome']}.{row['dimension']}"
        metrics[name] = float(row["narrowing"])
        metrics[f"{name}.ci_low"] = float(row["low"])
        metrics[f"{name}.ci_high"] = float(row["high"])
        metrics[f"{name}.p_value"] = float(row["p_value"])
    for row in tables.axes[tables.axes["model"] == model].to_dict("records"):
        metrics[f"feature_arm.change.{row['axis']}"] = float(row["change"])
    return metrics
