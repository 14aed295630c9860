"""The paper's tables: the quantities of each table of the race-conditioned refusal study, as
frames that the ``tables`` stage writes as CSV and booktabs LaTeX and the HTML report shows.

Tables 1-4 are computed here from the image editors' analysis frames (plain-arm audit requests,
the judges' ensemble verdicts joined; :func:`acrb.analysis.inputs.analysis_frame`), with the
intervals of the ``analyze`` stage's resampling code (:mod:`acrb.analysis.resampling`): a rate
or a mean with its interval at the design's two-way clustering on source images and prompts
(Wilson at the effective n for a rate, t for a mean score), and for a gap the interval by
test inversion (or the studentised max-t band) with the permutation test over sources.
Tables 5-7 are read from what other stages computed (the feature-arm comparison and the
WinoBias rates of ``analyze``, the judge-human agreement of ``review``); nothing is
recomputed for them.

1. ``judge_means``: mean ensemble score per axis per model.
2. ``race_rates``: judged skin lightening and race change rate per race and model.
3. ``model_summary``: edit success (mean score), soft erasure and race change rate per model.
4. ``race_gap``: race change rate by race (columns) per model, with Δ = max − min and its
   interval.
5. ``feature_mitigation``: per race, each outcome's rate without and with the feature prompt
   and the change; per model the change of the gap.
6. ``winobias``: the stereotype-following rate per model and role coding.
7. ``judge_human``: the judges against the human consensus per axis.

The table builders take frames and return a frame and read no files; :func:`read_paper_tables`
reads what the ``tables`` stage wrote, for the HTML report. Units: rates are
proportions in [0, 1] (the LaTeX and HTML show percentages), scores are on the rubric's 1-5
scale.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.frame import CLUSTER_COLUMN, check_columns, usable_rows
from acrb.analysis.latex import booktabs_table
from acrb.analysis.outcomes import outcome_phrase
from acrb.analysis.resampling import (
    Block,
    GroupTest,
    Resample,
    delta_bootstrap,
    delta_inversion,
    group_test_p,
    mean_intervals,
    prepare_block,
    rate_intervals,
)
from acrb.demographics import RACES
from acrb.storage import read_csv

#: The rubric axes of table 1, in the paper's order.
MEAN_AXES: tuple[str, ...] = ("edit_success", "skin_tone", "race_change", "gender_change",
                              "age_change")
#: The outcomes of table 2 (per race and model).
RACE_OUTCOMES: tuple[str, ...] = ("judge_lightening", "race_drift")
#: Table 3's measures: (column, kind) with kind "mean" (a score) or "rate" (an outcome).
SUMMARY_MEASURES: tuple[tuple[str, str], ...] = (("edit_success", "mean"),
                                                 ("soft_erasure", "rate"),
                                                 ("race_drift", "rate"))
#: The outcome of table 4.
GAP_OUTCOME = "race_drift"
#: The ``group`` of table 5's row that carries the gap (max − min over races).
GAP_ROW = "gap (max - min)"

JUDGE_MEANS_COLUMNS: tuple[str, ...] = ("model", "axis", "n", "n_sources", "mean", "low",
                                        "high", "confidence")
RACE_RATE_COLUMNS: tuple[str, ...] = ("model", "outcome", "race", "n_sources", "n", "k", "rate",
                                      "low", "high", "confidence")
FEATURE_COLUMNS: tuple[str, ...] = ("model", "outcome", "group", "n_pairs", "rate_none",
                                    "rate_feature", "change", "low", "high", "narrowing",
                                    "p_value", "confidence")
WINOBIAS_COLUMNS: tuple[str, ...] = ("model", "role_coding", "n", "following", "rate", "low",
                                     "high", "p_value", "abstained", "confidence", "note")
JUDGE_HUMAN_COLUMNS: tuple[str, ...] = ("axis", "n", "weighted_kappa", "spearman",
                                        "spearman_p", "mean_difference", "low", "high",
                                        "human_alpha", "human_alpha_low", "human_alpha_high")

#: The CSV schemas the feature-arm and WinoBias analyses write (data/analysis/arms/,
#: data/analysis/winobias/), the columns these tables read from them.
ARMS_GROUP_RATE_COLUMNS: tuple[str, ...] = ("model", "outcome", "dimension", "group", "n_pairs",
                                            "rate_none", "rate_feature", "change", "low",
                                            "high", "confidence")
ARMS_GAP_COLUMNS: tuple[str, ...] = ("model", "outcome", "dimension", "delta_none",
                                     "delta_feature", "narrowing", "low", "high", "p_value",
                                     "confidence")
WINOBIAS_RATE_COLUMNS: tuple[str, ...] = ("model", "role_coding", "n", "following", "rate",
                                          "low", "high", "p_value", "abstained", "confidence")
WINOBIAS_SKIPPED_COLUMNS: tuple[str, ...] = ("model", "reason")


@dataclass(frozen=True)
class Resampling:
    """The ``analyze`` stage's interval settings (params ``analyze``), which every computed
    table uses: coverage, bootstrap resamples and permutations, the seed, the units resampled
    and whether a table's gap intervals hold jointly."""

    confidence: float = 0.95
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES
    n_perm: int = defaults.PERMUTATIONS
    seed: int = defaults.SEED
    resample: Resample = "auto"
    simultaneous: bool = False
    test: GroupTest = "between-groups"

    def seed_for(self, *path: int) -> np.random.SeedSequence:
        """A seed per (table, model, cell): reproducible whatever else the run computes."""
        return np.random.SeedSequence([self.seed, *path])


def pooled_block(frame: pd.DataFrame, column: str) -> Block:
    """All the answered requests of ``frame`` with ``column`` observed, as one group
    (``"all"``): Y holds the column's sum and N its count per source x prompt, so the group
    "rate" of :func:`acrb.analysis.resampling.bootstrap_rates` is the pooled mean of the column
    (a rate for a boolean outcome, the mean score for a rubric axis), and its replicates are
    those of the cluster bootstrap the audit's rates use (prompts resampled within category)."""
    check_columns(frame, [CLUSTER_COLUMN, "prompt_id", "category", "status", column])
    usable = usable_rows(frame)
    values = pd.to_numeric(usable[column].astype("Float64"), errors="coerce").astype(float)
    seen = usable.loc[values.notna()].assign(_value=values.dropna())
    sources = sorted(seen[CLUSTER_COLUMN].astype(str).unique())
    prompts = sorted(seen["prompt_id"].astype(str).unique())
    cells = seen.assign(**{CLUSTER_COLUMN: seen[CLUSTER_COLUMN].astype(str),
                           "prompt_id": seen["prompt_id"].astype(str)})
    grouped = cells.groupby([CLUSTER_COLUMN, "prompt_id"])["_value"].agg(["sum", "count"])
    y = grouped["sum"].unstack().reindex(index=sources, columns=prompts).fillna(0.0)
    n = grouped["count"].unstack().reindex(index=sources, columns=prompts).fillna(0.0)
    category = cells.groupby("prompt_id")["category"].first().reindex(prompts).astype(str)
    return Block(
        outcome=column, dimension="all", groups=("all",) if sources else (),
        source_ids=np.asarray(sources, dtype=object),
        prompt_ids=np.asarray(prompts, dtype=object),
        group_index=np.zeros(len(sources), dtype=np.int64),
        prompt_stratum=pd.factorize(category.to_numpy(), sort=True)[0].astype(np.int64),
        y=y.to_numpy(float), n=n.to_numpy(float),
    )


def pooled_estimate(frame: pd.DataFrame, column: str, settings: Resampling,
                    kind: str = "mean") -> dict[str, float | int]:
    """The pooled mean of ``column`` over answered requests with its interval at the design's
    two-way clustering (sources and prompts): for ``kind`` ``"rate"`` (an outcome) the Wilson
    interval at the effective number of requests
    (:func:`acrb.analysis.resampling.rate_intervals`), for ``"mean"`` (a score) the mean ± t·√V
    (:func:`acrb.analysis.resampling.mean_intervals`), both with Student's t at
    min(sources, prompts) − 1 degrees of freedom, as the report's group rates. The same
    quantity (edit success in tables 1 and 3) so gets the same interval wherever it appears.
    Keys ``n``, ``n_sources``, ``estimate``, ``low``, ``high`` (NaN without data)."""
    block = pooled_block(frame, column)
    n = int(block.n.sum())
    if not n:
        return {"n": 0, "n_sources": 0, "estimate": math.nan, "low": math.nan,
                "high": math.nan}
    if kind not in ("mean", "rate"):
        raise ValueError(f"kind must be 'mean' or 'rate', not {kind!r}")
    low, high = (rate_intervals if kind == "rate" else mean_intervals)(block, settings.confidence)
    return {"n": n, "n_sources": block.n_sources,
            "estimate": float(block.y.sum() / n), "low": float(low[0]), "high": float(high[0])}


def judge_means(frames: Mapping[str, pd.DataFrame], settings: Resampling) -> pd.DataFrame:
    """Table 1: the mean ensemble score per axis of :data:`MEAN_AXES` per model, over the
    answered requests with a score on that axis, with its clustered interval
    (:func:`pooled_estimate`).
    Columns :data:`JUDGE_MEANS_COLUMNS`; an axis no request has gets n = 0 and NaN."""
    rows = []
    for model, frame in frames.items():
        for axis in MEAN_AXES:
            if axis not in frame:
                est: dict[str, Any] = {"n": 0, "n_sources": 0, "estimate": math.nan,
                                       "low": math.nan, "high": math.nan}
            else:
                est = pooled_estimate(frame, axis, settings, "mean")
            rows.append({"model": model, "axis": axis, "n": est["n"],
                         "n_sources": est["n_sources"], "mean": est["estimate"],
                         "low": est["low"], "high": est["high"],
                         "confidence": settings.confidence})
    return pd.DataFrame(rows, columns=list(JUDGE_MEANS_COLUMNS))


def race_rates(frames: Mapping[str, pd.DataFrame], settings: Resampling,
               outcomes: Sequence[str] = RACE_OUTCOMES) -> pd.DataFrame:
    """Table 2: the rate of each of ``outcomes`` per race of the source and model, with the
    interval at the design's two-way clustering that the report's group rates have
    (:func:`acrb.analysis.resampling.rate_intervals`: Wilson at the effective n, Student's t
    at min(sources, prompts) − 1 degrees of freedom).
    Columns :data:`RACE_RATE_COLUMNS`; races without an observed request are left out."""
    pieces = []
    for model, frame in frames.items():
        for outcome in outcomes:
            if outcome not in frame:
                continue
            block = prepare_block(frame, outcome, "race")
            if not block.groups:
                continue
            low, high = rate_intervals(block, settings.confidence)
            pieces.append(pd.DataFrame({
                "model": model, "outcome": outcome, "race": list(block.groups),
                "n_sources": block.group_sources.astype(np.int64),
                "n": block.group_n.astype(np.int64), "k": block.group_k.astype(np.int64),
                "rate": block.rates, "low": low, "high": high,
                "confidence": settings.confidence}))
    if not pieces:
        return pd.DataFrame(columns=list(RACE_RATE_COLUMNS))
    return pd.concat(pieces, ignore_index=True)[list(RACE_RATE_COLUMNS)]


def summary_columns() -> list[str]:
    """The columns of table 3: per measure its n, estimate and interval."""
    columns = ["model"]
    for measure, _ in SUMMARY_MEASURES:
        columns += [f"{measure}_n", measure, f"{measure}_low", f"{measure}_high"]
    return [*columns, "confidence"]


def model_summary(frames: Mapping[str, pd.DataFrame], settings: Resampling) -> pd.DataFrame:
    """Table 3: per model the mean edit success score and the soft erasure and race change
    rates over answered requests, each with its clustered interval (:func:`pooled_estimate`).
    Columns :func:`summary_columns`."""
    rows = []
    for model, frame in frames.items():
        row: dict[str, Any] = {"model": model}
        for measure, kind in SUMMARY_MEASURES:
            est: dict[str, Any] = (pooled_estimate(frame, measure, settings, kind)
                                   if measure in frame else
                                   {"n": 0, "estimate": math.nan, "low": math.nan,
                                    "high": math.nan})
            row.update({f"{measure}_n": est["n"], measure: est["estimate"],
                        f"{measure}_low": est["low"], f"{measure}_high": est["high"]})
        rows.append({**row, "confidence": settings.confidence})
    return pd.DataFrame(rows, columns=summary_columns())


def race_gap(frames: Mapping[str, pd.DataFrame], settings: Resampling,
             outcome: str = GAP_OUTCOME) -> pd.DataFrame:
    """Table 4: per model the rate of ``outcome`` for each race (one column per race, in
    vocabulary order, races no model has left out), Δ = max − min over the races with data
    (``gap``), the bias-corrected Δ (``gap_corrected``), the interval of Δ (by test inversion,
    :func:`acrb.analysis.resampling.delta_inversion`; with ``settings.simultaneous`` the
    studentised max-t bands of :func:`acrb.analysis.resampling.delta_bootstrap`, jointly over
    the table's models, Bonferroni) and the permutation p-value over sources
    (:func:`acrb.analysis.resampling.group_test_p` with ``settings.test``). Columns ``model``,
    the races, ``gap, gap_corrected, low, high, max_race, min_race, p_value, n, confidence``."""
    blocks = {model: prepare_block(frame, outcome, "race") for model, frame in frames.items()
              if outcome in frame}
    races = [r for r in RACES if any(r in b.groups for b in blocks.values())]
    family = sum(len(b.groups) >= 2 for b in blocks.values())
    over = max(family, 1)
    rows = []
    for m, (model, block) in enumerate(blocks.items()):
        boot_seed, perm_seed = settings.seed_for(4, m).spawn(2)
        test = group_test_p(block, settings.test, settings.n_perm, perm_seed)
        delta = delta_inversion(block, test.p_value, settings.confidence, settings.n_boot,
                                boot_seed, resample=settings.resample)
        low, high = delta.ci_low, delta.ci_high
        if settings.simultaneous:
            band = delta_bootstrap(block, settings.confidence, settings.n_boot, boot_seed, over,
                                   resample=settings.resample)
            low, high = band.ci_low, band.ci_high
        rates = dict(zip(block.groups, (float(r) for r in block.rates), strict=True))
        rows.append({"model": model, **{r: rates.get(r, math.nan) for r in races},
                     "gap": delta.estimate, "gap_corrected": delta.corrected,
                     "low": low + 0.0, "high": high + 0.0,
                     "max_race": delta.max_group, "min_race": delta.min_group,
                     "p_value": test.p_value, "n": delta.n,
                     "confidence": settings.confidence})
    columns = ["model", *races, "gap", "gap_corrected", "low", "high", "max_race", "min_race",
               "p_value", "n", "confidence"]
    return pd.DataFrame(rows, columns=columns)


def feature_mitigation(group_rates: pd.DataFrame, gap: pd.DataFrame,
                       dimension: str = "race") -> pd.DataFrame:
    """Table 5, from the feature-arm analysis (``data/analysis/arms/group_rates.csv`` and
    ``gap.csv``): per model, outcome and ``dimension`` group the rate without and with the
    feature prompt, the change (feature − none) and its interval; then per model and outcome
    a row :data:`GAP_ROW` with the gap (max − min) without and with the feature prompt, its
    change (feature − none: negative when the feature prompt narrows the gap, with the
    interval of ``narrowing`` negated) and ``narrowing`` as the analysis wrote it.
    Columns :data:`FEATURE_COLUMNS`."""
    check_columns(group_rates, list(ARMS_GROUP_RATE_COLUMNS))
    check_columns(gap, list(ARMS_GAP_COLUMNS))
    groups = group_rates[group_rates["dimension"] == dimension]
    gaps = gap[gap["dimension"] == dimension]
    rows = []
    for (model, outcome), block in groups.groupby(["model", "outcome"], sort=False):
        for _, row in block.iterrows():
            rows.append({"model": model, "outcome": outcome, "group": row["group"],
                         "n_pairs": row["n_pairs"], "rate_none": row["rate_none"],
                         "rate_feature": row["rate_feature"], "change": row["change"],
                         "low": row["low"], "high": row["high"], "narrowing": math.nan,
                         "p_value": math.nan, "confidence": row["confidence"]})
        for _, row in gaps[(gaps["model"] == model) & (gaps["outcome"] == outcome)].iterrows():
            rows.append({"model": model, "outcome": outcome, "group": GAP_ROW,
                         "n_pairs": int(block["n_pairs"].sum()),
                         "rate_none": row["delta_none"], "rate_feature": row["delta_feature"],
                         "change": row["delta_feature"] - row["delta_none"],
                         "low": -row["high"], "high": -row["low"],
                         "narrowing": row["narrowing"], "p_value": row["p_value"],
                         "confidence": row["confidence"]})
    return pd.DataFrame(rows, columns=list(FEATURE_COLUMNS))


def winobias(rates: pd.DataFrame, skipped: pd.DataFrame | None) -> pd.DataFrame:
    """Table 6, from the WinoBias analysis (``data/analysis/winobias/rates.csv`` and
    ``skipped.csv``): the stereotype-following rate per model and role coding with its
    interval and p-value against 0.5; then one row per skipped editor, its reason in
    ``note``. Columns :data:`WINOBIAS_COLUMNS`."""
    check_columns(rates, list(WINOBIAS_RATE_COLUMNS))
    table = rates[list(WINOBIAS_RATE_COLUMNS)].assign(note="")
    if skipped is not None and len(skipped):
        check_columns(skipped, list(WINOBIAS_SKIPPED_COLUMNS))
        extra = pd.DataFrame({"model": skipped["model"], "role_coding": "",
                              "note": "not run: " + skipped["reason"].astype(str)})
        table = pd.concat([table, extra], ignore_index=True)
    return table[list(WINOBIAS_COLUMNS)]


def judge_human(agreement_rows: pd.DataFrame, rater_agreement: pd.DataFrame | None
                ) -> pd.DataFrame:
    """Table 7, from the review stage's ``judge_human`` table (:func:`acrb.analysis.agreement.
    judge_human_agreement`): per axis over every reviewed unit, the quadratic-weighted kappa,
    Spearman's rho and the mean signed difference judge − human consensus with its interval;
    beside it people's own agreement (ordinal Krippendorff's alpha with its interval, from
    ``rater_agreement``), the ceiling a judge can be held to. Columns
    :data:`JUDGE_HUMAN_COLUMNS`."""
    check_columns(agreement_rows, ["axis", "dimension", "n", "weighted_kappa", "spearman",
                                   "spearman_p", "mean_difference", "ci_low", "ci_high"])
    overall = agreement_rows[agreement_rows["dimension"] == "all"]
    table = pd.DataFrame({"axis": overall["axis"], "n": overall["n"],
                          "weighted_kappa": overall["weighted_kappa"],
                          "spearman": overall["spearman"],
                          "spearman_p": overall["spearman_p"],
                          "mean_difference": overall["mean_difference"],
                          "low": overall["ci_low"], "high": overall["ci_high"]})
    alpha = pd.DataFrame(columns=["axis", "human_alpha", "human_alpha_low", "human_alpha_high"])
    if rater_agreement is not None and len(rater_agreement):
        rows = rater_agreement[(rater_agreement["dimension"] == "all")
                               & (rater_agreement["statistic"] == "alpha_ordinal")]
        alpha = pd.DataFrame({"axis": rows["axis"], "human_alpha": rows["estimate"],
                              "human_alpha_low": rows["ci_low"],
                              "human_alpha_high": rows["ci_high"]})
    return table.merge(alpha, on="axis", how="left")[list(JUDGE_HUMAN_COLUMNS)]


# --------------------------------------------------------------------------------------------
# Rendering: the same cells for LaTeX and HTML


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fmt_pct(value: Any, low: Any = None, high: Any = None) -> str:
    """A proportion as a percentage with one decimal, and its interval when given."""
    if _missing(value):
        return "--"
    # + 0.0 turns a clipped -0.0 into 0.0
    text = f"{100 * float(value) + 0.0:.1f}"
    if low is not None and not _missing(low) and not _missing(high):
        text += f" [{100 * float(low) + 0.0:.1f}, {100 * float(high) + 0.0:.1f}]"
    return text


def fmt_num(value: Any, low: Any = None, high: Any = None, digits: int = 2) -> str:
    """A number with ``digits`` decimals, and its interval when given."""
    if _missing(value):
        return "--"
    text = f"{float(value) + 0.0:.{digits}f}"
    if low is not None and not _missing(low) and not _missing(high):
        text += f" [{float(low) + 0.0:.{digits}f}, {float(high) + 0.0:.{digits}f}]"
    return text


def fmt_p(value: Any) -> str:
    if _missing(value):
        return "--"
    return "<0.001" if float(value) < 0.001 else f"{float(value):.3f}"


def _text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def _level(frame: pd.DataFrame) -> str:
    if "confidence" in frame and frame["confidence"].notna().any():
        return f"{round(100 * float(frame['confidence'].dropna().iloc[0]))}%"
    return ""


@dataclass(frozen=True)
class Display:
    """A table as people read it: a header, rows of text cells, and the caption's text."""

    header: list[str]
    rows: list[list[str]]
    caption: str
    align: str


def _display_judge_means(frame: pd.DataFrame) -> Display:
    models = list(dict.fromkeys(frame["model"]))
    rows = []
    for model in models:
        part = frame[frame["model"] == model].set_index("axis")
        rows.append([str(model), *[fmt_num(part.loc[a, "mean"], part.loc[a, "low"],
                                           part.loc[a, "high"]) if a in part.index else "--"
                                   for a in MEAN_AXES]])
    caption = (f"Mean judge ensemble score per axis (1-5) over answered plain-arm requests, "
               f"with {_level(frame)} clustered intervals.")
    return Display(["Model", *[a.replace("_", " ") for a in MEAN_AXES]], rows, caption,
                   "l" + "c" * len(MEAN_AXES))


def _display_race_rates(frame: pd.DataFrame) -> Display:
    models = list(dict.fromkeys(frame["model"]))
    races = [r for r in RACES if r in set(frame["race"])]
    columns = [(m, o) for m in models for o in RACE_OUTCOMES]
    rows = []
    for race in races:
        cells = [race]
        for model, outcome in columns:
            hit = frame[(frame["model"] == model) & (frame["outcome"] == outcome)
                        & (frame["race"] == race)]
            cells.append(fmt_pct(*hit.iloc[0][["rate", "low", "high"]]) if len(hit) else "--")
        rows.append(cells)
    header = ["Race", *[f"{m}: {outcome_phrase(o)} (%)" for m, o in columns]]
    caption = (f"Judged skin lightening and race change rates (%) per source race and model, "
               f"with {_level(frame)} clustered intervals.")
    return Display(header, rows, caption, "l" + "c" * len(columns))


def _display_model_summary(frame: pd.DataFrame) -> Display:
    rows = [[str(row["model"]),
             fmt_num(row["edit_success"], row["edit_success_low"], row["edit_success_high"]),
             fmt_pct(row["soft_erasure"], row["soft_erasure_low"], row["soft_erasure_high"]),
             fmt_pct(row["race_drift"], row["race_drift_low"], row["race_drift_high"])]
            for _, row in frame.iterrows()]
    caption = (f"Edit success (mean score, 1-5), soft erasure and race change rates (%) per "
               f"model, with {_level(frame)} clustered intervals.")
    return Display(["Model", "Edit success", "Soft erasure (%)", "Race change (%)"], rows,
                   caption, "lccc")


def _display_race_gap(frame: pd.DataFrame) -> Display:
    races = [c for c in frame.columns if c in RACES]
    rows = [[str(row["model"]), *[fmt_pct(row[r]) for r in races],
             fmt_pct(row["gap"], row["low"], row["high"]), fmt_pct(row.get("gap_corrected")),
             fmt_p(row["p_value"])]
            for _, row in frame.iterrows()]
    caption = (f"Race change rate (%) by source race per model; gap = max - min over races "
               f"with the {_level(frame)} interval of the gap (cluster bootstrap), the "
               f"bias-corrected gap (max - min of estimated rates overstates the gap, most "
               f"when the races are equal) and the permutation p-value.")
    return Display(["Model", *races, "Gap (pp)", "Corrected gap (pp)", "p"], rows, caption,
                   "l" + "c" * len(races) + "ccr")


def _display_feature(frame: pd.DataFrame) -> Display:
    rows = [[str(row["model"]), outcome_phrase(str(row["outcome"])), str(row["group"]),
             fmt_pct(row["rate_none"]), fmt_pct(row["rate_feature"]),
             fmt_pct(row["change"], row["low"], row["high"]), fmt_p(row["p_value"])]
            for _, row in frame.iterrows()]
    caption = ("Feature-prompt mitigation per race: rates (%) without and with the feature "
               "prompt on the same requests, and the change (feature - none, pp) with its "
               f"{_level(frame)} source-clustered interval; on the gap row a negative change "
               "means the feature prompt narrows the gap between races.")
    return Display(["Model", "Outcome", "Race", "None (%)", "Feature (%)", "Change (pp)", "p"],
                   rows, caption, "lllcccr")


def _display_winobias(frame: pd.DataFrame) -> Display:
    rows = []
    for _, row in frame.iterrows():
        if _text(row["note"]):
            rows.append([str(row["model"]), "--", "--", "--", "--", _text(row["note"])])
            continue
        rows.append([str(row["model"]), _text(row["role_coding"]),
                     f"{int(row['following'])}/{int(row['n'])}",
                     fmt_pct(row["rate"], row["low"], row["high"]), fmt_p(row["p_value"]),
                     f"{int(row['abstained'])} abstained" if not _missing(row["abstained"])
                     else ""])
    caption = ("WinoBias: stereotype-following rate (%) per model and role coding, with its "
               f"{_level(frame)} interval and p-value against 50%.")
    return Display(["Model", "Role", "Following", "Rate (%)", "p", "Note"], rows, caption,
                   "llrcrl")


def _display_judge_human(frame: pd.DataFrame) -> Display:
    rows = [[str(row["axis"]).replace("_", " "), _text(row["n"]),
             fmt_num(row["weighted_kappa"]), fmt_num(row["spearman"]),
             fmt_num(row["mean_difference"], row["low"], row["high"]),
             fmt_num(row["human_alpha"], row["human_alpha_low"], row["human_alpha_high"])]
            for _, row in frame.iterrows()]
    caption = ("Judges against people per axis on the random review sample: quadratic-weighted "
               "kappa, Spearman's rho, mean difference judge - human consensus (scale steps, "
               "95% t interval) and people's own agreement (ordinal Krippendorff's alpha).")
    return Display(["Axis", "n", "Weighted kappa", "Spearman", "Judge - human",
                    "Human alpha"], rows, caption, "lrrrcc")


@dataclass(frozen=True)
class TableSpec:
    """One of the paper's tables: its number, file stem, title and how it is shown."""

    number: int
    id: str
    title: str
    display: Callable[[pd.DataFrame], Display]


TABLES: tuple[TableSpec, ...] = (
    TableSpec(1, "judge_means", "Mean judge score per axis and model", _display_judge_means),
    TableSpec(2, "race_rates", "Lightening and race change by race and model",
              _display_race_rates),
    TableSpec(3, "model_summary", "Edit success, soft erasure and race change per model",
              _display_model_summary),
    TableSpec(4, "race_gap", "Race change by race and model, with the max - min gap",
              _display_race_gap),
    TableSpec(5, "feature_mitigation", "Feature-prompt mitigation per race", _display_feature),
    TableSpec(6, "winobias", "WinoBias stereotype-following rates", _display_winobias),
    TableSpec(7, "judge_human", "Judge vs human per axis", _display_judge_human),
)
SPECS: dict[str, TableSpec] = {spec.id: spec for spec in TABLES}


@dataclass(frozen=True)
class Provenance:
    """Where a table's numbers come from: the run (profile, simulation or not, git commit),
    the params hash (:attr:`acrb.stages.context.StageContext.params_hash`) and the sha256 of
    every input file (project-relative path -> hex digest), summarised in ``inputs_digest``:
    the sha256 of the sorted ``path digest`` lines."""

    profile: str
    params_hash: str
    simulated: bool
    git_commit: str
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def inputs_digest(self) -> str:
        lines = "".join(f"{path} {digest}\n" for path, digest in sorted(self.inputs.items()))
        return hashlib.sha256(lines.encode("utf-8")).hexdigest()

    def footer(self) -> str:
        """The line every table carries (LaTeX footnote, HTML caption)."""
        run = f"profile {self.profile}" + (", SIMULATION (planted values, not measurements)"
                                           if self.simulated else "")
        return (f"Run: {run}; params {self.params_hash}; git {self.git_commit[:12]}; "
                f"inputs sha256 {self.inputs_digest[:12]} ({len(self.inputs)} files, "
                "listed in data/tables/index.json).")


def latex_table(spec: TableSpec, frame: pd.DataFrame, provenance: Provenance) -> str:
    """The booktabs LaTeX of one table, its provenance as a footnote under the tabular."""
    shown = spec.display(frame)
    title = ("SIMULATION. " if provenance.simulated else "") + shown.caption
    return booktabs_table(shown.header, shown.rows, title, f"tab:paper-{spec.id}".replace(
        "_", "-"), shown.align, footer=provenance.footer())


def read_paper_tables(folder: Path) -> list[dict[str, Any]] | None:
    """The report's view of the tables the ``tables`` stage wrote in ``folder`` (its
    ``index.json`` and CSVs), or None when the stage has not run: per table its number, id,
    title, status and note, and for a written table the header and text rows (the cells of
    the LaTeX), the caption and the provenance footer."""
    index_path = folder / "index.json"
    if not index_path.is_file():
        return None
    index = json.loads(index_path.read_text())
    views = []
    for entry in index["tables"]:
        view: dict[str, Any] = {"number": entry["number"], "id": entry["id"],
                                "title": entry["title"], "status": entry["status"],
                                "note": entry.get("note", ""),
                                "footer": entry["provenance"]["footer"],
                                "columns": [], "rows": [], "caption": ""}
        csv_path = folder / f"{entry['id']}.csv"
        spec = SPECS.get(entry["id"])
        if entry["status"] == "written" and spec is not None and csv_path.is_file():
            shown = spec.display(read_csv(csv_path, keep_default_na=True))
            view.update(columns=shown.header, rows=shown.rows, caption=shown.caption)
        views.append(view)
    return views


__all__ = [
    "FEATURE_COLUMNS",
    "GAP_ROW",
    "JUDGE_HUMAN_COLUMNS",
    "JUDGE_MEANS_COLUMNS",
    "MEAN_AXES",
    "RACE_RATE_COLUMNS",
    "SPECS",
    "TABLES",
    "WINOBIAS_COLUMNS",
    "Display",
    "Provenance",
    "Resampling",
    "TableSpec",
    "feature_mitigation",
    "judge_human",
    "judge_means",
    "latex_table",
    "model_summary",
    "pooled_block",
    "pooled_estimate",
    "race_gap",
    "race_rates",
    "read_paper_tables",
    "winobias",
]
