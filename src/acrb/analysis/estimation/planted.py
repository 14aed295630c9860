"""Planted against measured: does the pipeline recover the biases planted in simulated editors?

A simulated editor (:mod:`acrb.models.synthetic`) draws each request's outcomes from planted
probabilities, recorded per request in the analysis frame as ``planted_refusal`` (unconditional),
``planted_erasure`` and ``planted_lightening`` (both conditional on the request not being
refused). The *planted rate* of a group is the expected value of the rate ACRB measures for that
group, computed exactly from these probabilities rather than estimated, so the comparison with
the measured rate and its interval checks the detectors and the statistics together.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from acrb.analysis.frame import ALL_CATEGORIES, category_levels, check_columns, usable_rows
from acrb.demographics import SOURCE_DIMENSIONS

#: Which per-request planted probability column drives each outcome.
PLANTED_COLUMNS: dict[str, str] = {
    "hard_refusal": "planted_refusal",
    "erasure": "planted_erasure",
    "lightening": "planted_lightening",
}

#: The ``value`` of the row that compares planted with measured Δ.
DELTA_ROW = "Δ"

PLANTED_VS_MEASURED_COLUMNS: tuple[str, ...] = (
    "outcome",
    "category",
    "dimension",
    "value",
    "planted",
    "measured",
    "ci_low",
    "ci_high",
    "covered",
)


def has_planted(frame: pd.DataFrame) -> bool:
    """Whether the frame carries the planted probabilities of a simulated editor."""
    return all(column in frame.columns for column in PLANTED_COLUMNS.values())


def planted_group_rates(frame: pd.DataFrame, outcome: str) -> pd.DataFrame:
    """The exact expected rate of ``outcome`` per category (and ``"all"``) and source group.

    With r_i the planted refusal probability of request i and q_i its planted conditional
    probability of ``outcome`` given not refused:

    - hard refusal: mean_i r_i (refusal is unconditional);
    - erasure, lightening: Σ_i (1 − r_i) q_i / Σ_i (1 − r_i), the expected number of erased
      (lightened) edits over the expected number of non-refused requests, which is what the
      measured conditional rate estimates (its ratio-of-expectations limit as n grows).

    Only the rows that count take part (:func:`acrb.analysis.frame.usable_rows`: no ``error``,
    no ``missing``), as in the measured rates, and of those only rows whose ``hard_refusal`` is
    observed when the frame has that column, so planted and measured rates describe the same
    requests. Refusal
    is not conditioned on its *measured* value: that would bias the conditional rates. Returns
    columns ``outcome, category, dimension, value, planted`` (planted: a proportion in [0, 1];
    NaN for a group with no rows, or, for a conditional outcome, whose requests are all
    certain to be refused), in the row order of :func:`acrb.analysis.estimation.rates.group_rates`.
    """
    if outcome not in PLANTED_COLUMNS:
        raise ValueError(f"unknown outcome '{outcome}'; expected one of {sorted(PLANTED_COLUMNS)}")
    needed = ["planted_refusal", PLANTED_COLUMNS[outcome]]
    check_columns(frame, ["category", "status", *needed, *SOURCE_DIMENSIONS])
    levels = category_levels(frame)
    usable = usable_rows(frame)
    if "hard_refusal" in usable.columns:
        usable = usable.loc[usable["hard_refusal"].notna()]
    refusal = usable["planted_refusal"].to_numpy(dtype=float)
    if outcome == "hard_refusal":
        weight = np.ones_like(refusal)
        probability = refusal
    else:
        weight = 1.0 - refusal
        probability = usable[PLANTED_COLUMNS[outcome]].to_numpy(dtype=float)
    sums = pd.DataFrame(
        {
            "category": usable["category"].astype(str).to_numpy(),
            "numerator": weight * probability,
            "denominator": weight,
        }
    )
    pieces = []
    for dimension, values in SOURCE_DIMENSIONS.items():
        with_group = sums.assign(value=usable[dimension].astype(str).to_numpy())
        by_category = with_group.groupby(["category", "value"])[["numerator", "denominator"]].sum()
        pooled = with_group.groupby("value")[["numerator", "denominator"]].sum()
        pooled.index = pd.MultiIndex.from_product(
            [[ALL_CATEGORIES], pooled.index], names=["category", "value"]
        )
        full_index = pd.MultiIndex.from_product([levels, values], names=["category", "value"])
        table = pd.concat([pooled, by_category]).reindex(full_index, fill_value=0.0).reset_index()
        denominator = table["denominator"].to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            planted = np.where(denominator > 0, table["numerator"].to_numpy() / denominator, np.nan)
        pieces.append(
            pd.DataFrame(
                {
                    "category": table["category"],
                    "dimension": dimension,
                    "value": table["value"],
                    "planted": planted,
                }
            )
        )
    result = pd.concat(pieces, ignore_index=True)
    order = {c: i for i, c in enumerate(levels)}
    result = result.sort_values(
        "category", key=lambda s: s.map(order), kind="stable", ignore_index=True
    )
    result.insert(0, "outcome", outcome)
    return result


def planted_vs_measured(
    frame: pd.DataFrame, rates: pd.DataFrame, disparities: pd.DataFrame, outcome: str
) -> pd.DataFrame:
    """Planted against measured rates and Δ of one outcome, with interval coverage.

    Parameters
    ----------
    frame:
        The analysis frame of a simulated model (with the planted columns).
    rates, disparities:
        Outputs of :func:`acrb.analysis.estimation.rates.group_rates` and of
        :func:`acrb.analysis.estimation.resampling.clustered_disparities` (or
        :func:`acrb.analysis.estimation.disparity.disparities`) for this frame (rows of other
        outcomes are ignored, so tables concatenated over outcomes may be passed).
    outcome:
        One of :data:`acrb.analysis.outcomes.OUTCOMES`.

    Returns
    -------
    DataFrame with columns ``outcome, category, dimension, value, planted, measured, ci_low,
    ci_high, covered``: per category and dimension, one row per group (measured = the group
    rate and its Wilson interval) followed by one row with value ``"Δ"`` (planted Δ = max −
    min of the planted group rates over groups with a planted rate; measured = Δ and its
    simultaneous interval). ``covered`` (nullable boolean) says whether the interval contains
    the planted value; NA where either is missing. Over many groups about 5% of 95% Wilson
    intervals are expected to miss; the Δ interval is conservative and should almost never.
    """
    planted = planted_group_rates(frame, outcome)
    measured = rates.loc[
        rates["outcome"] == outcome, ["category", "dimension", "value", "rate", "ci_low", "ci_high"]
    ].rename(columns={"rate": "measured"})
    groups = planted.merge(measured, on=["category", "dimension", "value"], how="left")

    planted_delta = (
        planted.dropna(subset=["planted"])
        .groupby(["category", "dimension"], sort=False)["planted"]
        .agg(lambda s: s.max() - s.min())
        .rename("planted")
    )
    keys = planted[["category", "dimension"]].drop_duplicates(ignore_index=True)
    measured_delta = disparities.loc[
        disparities["outcome"] == outcome, ["category", "dimension", "delta", "ci_low", "ci_high"]
    ].rename(columns={"delta": "measured"})
    deltas = (
        keys.merge(planted_delta.reset_index(), on=["category", "dimension"], how="left")
        .merge(measured_delta, on=["category", "dimension"], how="left")
        .assign(outcome=outcome, value=DELTA_ROW)
    )

    # Put each Δ row after the groups of its category and dimension.
    block = keys.reset_index(names="block")
    groups = groups.merge(block, on=["category", "dimension"]).assign(is_delta=0)
    deltas = deltas.merge(block, on=["category", "dimension"]).assign(is_delta=1)
    groups["position"] = np.arange(len(groups))
    deltas["position"] = 0
    result = pd.concat([groups, deltas], ignore_index=True).sort_values(
        ["block", "is_delta", "position"], kind="stable", ignore_index=True
    )

    result["covered"] = interval_covers(result)
    return result[list(PLANTED_VS_MEASURED_COLUMNS)]


def interval_covers(frame: pd.DataFrame) -> pd.api.extensions.ExtensionArray:
    """Whether each row's interval [``ci_low``, ``ci_high``] holds its ``planted`` value: a
    nullable boolean, NA where the planted value or an end of the interval is unknown."""
    truth = frame["planted"].to_numpy(dtype=float)
    low = frame["ci_low"].to_numpy(dtype=float)
    high = frame["ci_high"].to_numpy(dtype=float)
    known = np.isfinite(truth) & np.isfinite(low) & np.isfinite(high)
    # A small tolerance: Δ intervals clipped at exactly 0 must cover a planted Δ of 0.
    inside = (truth >= low - 1e-12) & (truth <= high + 1e-12)
    covered = pd.array(np.where(known, inside, False), dtype="boolean")
    covered[~known] = pd.NA
    return covered
