"""The report's "Human review" part, from the tables of the ``review`` stage.

Nothing is computed here: :func:`read_review` reads ``data/review/analysis/`` and
:func:`review_view` turns it into titled tables of formatted cells for the template.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.analysis.agreement.raters import ALL, ARM_DIFFERENCE, ARMS, BOTH
from acrb.storage import read_csv

#: Tables the report reads (written by :mod:`acrb.stages.review`).
REVIEW_TABLES = ("agreement", "consistency", "judge_human", "judge_misses", "group_tests",
                 "arm_tests", "group_means", "corrected_rates", "corrected_deltas")
#: The review stage's list of imported survey items and their match to requests (CSV).
MATCHES_FILE = "survey_matches.csv"
SIMULATED_RATERS_BANNER = (
    "SIMULATION: these ratings come from simulated raters with planted noise (params "
    "review.simulated), not from people. They show what the review measures and how it corrects "
    "a biased judge; they measure no one.")
#: Judge outcomes whose per-group corrected rates the report lists in full.
DETAILED_OUTCOMES = ("soft_erasure", "judge_lightening")


@dataclass(frozen=True)
class ReviewTables:
    info: dict[str, Any]
    tables: dict[str, pd.DataFrame]


def read_review(folder: Path) -> ReviewTables | None:
    """The review stage's tables in ``folder``, or None when it has not run."""
    info_path = folder / "review.json"
    if not info_path.is_file():
        return None
    tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in REVIEW_TABLES
              if (folder / f"{name}.parquet").is_file()}
    if (folder / MATCHES_FILE).is_file():
        tables["survey_matches"] = read_csv(folder / MATCHES_FILE, keep_default_na=False)
    return ReviewTables(json.loads(info_path.read_text()), tables)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or bool(
        pd.isna(value))


def _num(value: Any, digits: int = 2) -> str:
    return "—" if _missing(value) else f"{float(value):.{digits}f}"


def _pct(value: Any) -> str:
    return "—" if _missing(value) else f"{100 * float(value):.1f}%"


def _interval(low: Any, high: Any, scale: float = 1.0, digits: int = 2) -> str:
    if _missing(low) or _missing(high):
        return ""
    return f"[{scale * float(low):.{digits}f}, {scale * float(high):.{digits}f}]"


def _cell(text: str, num: bool = False) -> dict[str, Any]:
    return {"text": text, "num": num}


def _table(table_id: str, title: str, note: str, columns: Sequence[str],
           rows: list[list[dict[str, Any]]], empty: str = "no rows",
           flagged: Sequence[bool] | None = None) -> dict[str, Any]:
    marks = list(flagged) if flagged is not None else [False] * len(rows)
    return {"id": table_id, "title": title, "note": note, "columns": list(columns),
            "rows": [{"cells": r, "flagged": f} for r, f in zip(rows, marks, strict=True)],
            "empty": empty}


def _agreement(frame: pd.DataFrame) -> dict[str, Any]:
    overall = frame[frame["dimension"] == ALL]
    rows = []
    for (axis, arm), part in overall.groupby(["axis", "arm"], sort=False):
        stats = {r["statistic"]: r for _, r in part.iterrows()}
        cells = [_cell(str(axis)), _cell(str(arm)), _cell(str(int(part["n_items"].max())), True),
                 _cell(str(int(part["n_units"].max())), True)]
        for statistic in ("alpha_interval", "alpha_ordinal", "fleiss_kappa"):
            row = stats.get(statistic)
            text = ("—" if row is None else
                    f"{_num(row['estimate'])} {_interval(row['ci_low'], row['ci_high'])}")
            cells.append(_cell(text, True))
        rows.append(cells)
    rows.sort(key=lambda cells: ARMS.index(cells[1]["text"]) if cells[1]["text"] in ARMS
              else len(ARMS))
    return _table("agreement", "Agreement between raters",
                  "Per axis and arm (the edited outputs, the feature-prompt outputs, both "
                  "pooled): Krippendorff's alpha at the interval and the ordinal level and "
                  "Fleiss' kappa (answers as categories; every rating used, units with unequal "
                  "numbers of ratings each weighted equally), with a percentile bootstrap "
                  "interval over items. An axis on which every output has the same true answer "
                  "(no change of gender, say) has almost no variation to agree on, so its "
                  "coefficients sit near 0 however careful the raters are.",
                  ["axis", "arm", "items", "outputs", "α interval", "α ordinal", "Fleiss κ"],
                  rows)


def _agreement_by_race(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[(frame["dimension"] == "race") & (frame["statistic"] == "alpha_interval")
                 & (frame["arm"] == BOTH)]
    axes = list(dict.fromkeys(part["axis"]))
    groups = list(dict.fromkeys(part["group"]))
    rows = []
    for group in groups:
        cells = [_cell(str(group))]
        for axis in axes:
            hit = part[(part["group"] == group) & (part["axis"] == axis)]
            cells.append(_cell(_num(hit["estimate"].iloc[0]) if len(hit) else "—", True))
        rows.append(cells)
    return _table("agreement-race", "Agreement between raters by race of the source",
                  "Krippendorff's alpha (interval, both arms pooled) per axis among the outputs "
                  "of each race's sources: raters who agree less on one group's faces make that "
                  "group's ratings noisier.", ["race", *axes], rows)


def _group_means(frame: pd.DataFrame) -> dict[str, Any]:
    """People's mean consensus by race: edited outputs, and the change with the feature
    prompt where pairs were rated (the study's human-evaluation figure)."""
    outputs = [o for o in ("edited", ARM_DIFFERENCE) if (frame["output"] == o).any()]
    axes = list(dict.fromkeys(frame["axis"]))
    rows = []
    for output in outputs:
        part = frame[frame["output"] == output]
        for group in dict.fromkeys(part["group"]):
            cells = [_cell(output), _cell(str(group))]
            for axis in axes:
                hit = part[(part["group"] == group) & (part["axis"] == axis)]
                value = hit["mean"].iloc[0] if len(hit) else math.nan
                cells.append(_cell("—" if _missing(value) else _num(value), True))
            rows.append(cells)
    return _table("group-means", "People's mean scores by race of the source",
                  "Mean of each output's consensus score among the outputs of each race's "
                  "sources (edited outputs), and the mean paired change with the feature prompt "
                  "(feature − edited) where both outputs were rated.",
                  ["output", "race", *axes], rows)


def _unmatched(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[frame["status"] != "matched"]
    rows = [[_cell(str(r["item_id"])), _cell(str(r["survey_model"])), _cell(str(r["prompt_id"])),
             _cell(f"{r['race']} {r['gender']} {r['age']}"), _cell(str(r["note"]))]
            for _, r in part.iterrows()]
    return _table("unmatched", "Imported items not matched to a request of this run",
                  "Survey items whose model, prompt and source cell name no single plain-arm "
                  "request of this run: they count for agreement between raters, not for the "
                  "judges against people or the corrected rates.",
                  ["item", "survey model", "prompt", "source cell", "why"], rows,
                  "every imported item was matched")


def _summary(info: dict[str, Any]) -> str:
    """The ratings' origin and counts as they are (counted by the review stage)."""
    origin = info.get("origin", "")
    ratings_from = info.get("ratings_from") or origin
    text = (f"{info.get('ratings', 0)} ratings of {info.get('outputs', info.get('items', 0))} "
            f"outputs of {info.get('items', 0)} items by {info.get('raters', 0)} raters: "
            f"{ratings_from} ({origin}); {info.get('raters_per_item', '?')} raters per item, "
            f"{info.get('repeats', 0)} repeated ratings.")
    if info.get("imported_items"):
        text += (f" Of the {info['imported_items']} imported survey items (the survey's own "
                 f"sample), {info.get('matched_items', 0)} were matched to requests of this "
                 f"run (judges against people and corrected rates use those) and "
                 f"{info.get('unmatched_items', 0)} were not (listed below).")
    else:
        text += (f" {info.get('random_sample', 0)} of the rated items were drawn at random; "
                 "the rest are items the judges disagreed on.")
    return text


def _consistency(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[frame["rater"] == ALL]
    rows = [[_cell(str(r["axis"])), _cell(str(int(r["n_pairs"])), True),
             _cell(_pct(r["share_identical"]), True), _cell(_num(r["weighted_kappa"]), True)]
            for _, r in part.iterrows()]
    return _table("consistency", "Consistency within raters",
                  "Items shown to the same rater a second time: share of identical answers and "
                  "quadratic-weighted kappa between the first and second answer.",
                  ["axis", "pairs", "identical", "weighted κ"], rows,
                  "no item was shown twice")


def _judge_human(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[(frame["dimension"] == ALL)
                 | ((frame["dimension"] == "race")
                    & frame["axis"].isin(["edit_success", "skin_tone"]))]
    rows = [[_cell(str(r["axis"])), _cell(str(r["group"])), _cell(str(int(r["n"])), True),
             _cell(_num(r["weighted_kappa"]), True), _cell(_num(r["spearman"]), True),
             _cell(f"{_num(r['mean_difference'])} {_interval(r['ci_low'], r['ci_high'])}",
                   True)]
            for _, r in part.iterrows()]
    return _table("judge-human", "The judges against people (random sample)",
                  "The judges' ensemble score against the raters' consensus (median) on the "
                  "randomly sampled outputs: quadratic-weighted kappa, Spearman's rho and the "
                  "mean signed difference judge − people in scale steps (on skin tone, positive "
                  "= the judge reads lighter), with a 95% interval; every axis overall, edit "
                  "success and skin tone by race.",
                  ["axis", "group", "n", "weighted κ", "Spearman ρ", "judge − people"], rows)


def _misses(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[frame["human_positive"].fillna(0) > 0]
    rows, flags = [], []
    for _, r in part.iterrows():
        rows.append([_cell(str(r["outcome"])), _cell(str(r["group"])),
                     _cell(str(int(r["human_positive"])), True),
                     _cell(str(int(r["judge_missed"])), True),
                     _cell(f"{_pct(r['miss_rate'])} {_interval(r['ci_low'], r['ci_high'], 100, 1)}",
                           True),
                     _cell(_num(r["p_value"], 3), True)])
        flags.append(not _missing(r["p_value"]) and float(r["p_value"]) < 0.05)
    return _table("judge-misses", "What the judges miss, by race",
                  "Among the randomly sampled outputs where people's consensus shows the outcome, "
                  "the share the judges did not flag, with a Wilson interval; p: test that the "
                  "miss rate is the same for every race (the same p on each row of an outcome; "
                  "rows with p < 0.05 are flagged).",
                  ["outcome", "race", "people saw it", "judges missed", "miss rate", "p"],
                  rows, "people saw none of the judge outcomes in the sample", flags)


def _corrected_deltas(frame: pd.DataFrame) -> dict[str, Any]:
    part = frame[frame["dimension"] == "race"]
    rows = []
    for (model, outcome), group in part.groupby(["model", "outcome"], sort=False):
        by = {r["estimator"]: r for _, r in group.iterrows()}
        ppi = by.get("ppi")
        if ppi is None or not ppi["group_a"]:
            continue
        cells = [_cell(str(model)), _cell(str(outcome)),
                 _cell(f"{ppi['group_a']} − {ppi['group_b']}")]
        for estimator in ("judge", "human", "ppi"):
            r = by.get(estimator)
            cells.append(_cell("—" if r is None else
                               f"{_num(100 * r['delta'], 1)} "
                               f"{_interval(r['ci_low'], r['ci_high'], 100, 1)}", True))
        rows.append(cells)
    return _table("corrected-deltas", "Judge-corrected race Δ",
                  "Δ (percentage points) between the races with the highest and lowest "
                  "judge-corrected rate, by three estimators: the judges alone on every judged "
                  "output, people alone on the random sample, and prediction-powered inference "
                  "(people's labels correct the judges' error; Angelopoulos et al., Science "
                  "2023). Judge-only intervals ignore the judges' error, so a judge that errs "
                  "more for one group gives a narrow interval around a biased Δ; the corrected "
                  "interval is valid whatever the judges' error, given enough labels (below about "
                  "100 labelled outputs per group it is approximate: 92.7% coverage at 50 in "
                  "benchmarks/ppi_coverage.py). The pair is picked from the data, so every "
                  "interval here is simultaneous over all pairs of races (Bonferroni), as the "
                  "audit's Δ intervals are.",
                  ["model", "outcome", "races", "judges only", "people only", "corrected"], rows)


def _corrected_rates(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    part = frame[(frame["dimension"] == "race") & frame["outcome"].isin(DETAILED_OUTCOMES)]
    for (model, outcome), group in part.groupby(["model", "outcome"], sort=False):
        rows = []
        for race, sub in group.groupby("group", sort=False):
            by = {r["estimator"]: r for _, r in sub.iterrows()}
            cells = [_cell(str(race)),
                     _cell(str(int(by["ppi"]["n_labelled"])) if "ppi" in by else "—", True)]
            for estimator in ("judge", "human", "ppi"):
                r = by.get(estimator)
                cells.append(_cell("—" if r is None else
                                   f"{_pct(r['rate'])} "
                                   f"{_interval(r['ci_low'], r['ci_high'], 100, 1)}", True))
            rows.append(cells)
        out.append(_table(f"corrected-{model}-{outcome}",
                          f"{model}: {outcome} by race, judges only, people only and corrected",
                          "Rate of the outcome among judged outputs of each race's sources, "
                          "with 95% intervals; rated: outputs of the random sample people "
                          "rated.",
                          ["race", "rated", "judges only", "people only", "corrected"], rows))
    return out


def _tests(frame: pd.DataFrame, table_id: str, title: str, note: str) -> dict[str, Any]:
    rows = [[_cell(str(r["axis"])), _cell(str(r["test"])), _cell(str(r["groups"])),
             _cell(str(int(r["n"])), True), _cell(_num(r["statistic"]), True),
             _cell(_num(r["p_value"], 3), True), _cell(_num(r["p_adjusted"], 3), True)]
            for _, r in frame.iterrows()]
    flags = [not _missing(r["p_adjusted"]) and float(r["p_adjusted"]) < 0.05
             for _, r in frame.iterrows()]
    return _table(table_id, title, note, ["axis", "test", "groups", "n", "statistic", "p",
                                          "p (Holm)"], rows, "no paired outputs were rated",
                  flags)


def review_view(review: ReviewTables | None) -> dict[str, Any] | None:
    """The template's view of the human review, or None when the stage has not run."""
    if review is None:
        return None
    info, t = review.info, review.tables
    summary = _summary(info)
    tables = [_agreement(t["agreement"]), _agreement_by_race(t["agreement"]),
              _consistency(t["consistency"]), _judge_human(t["judge_human"]),
              _misses(t["judge_misses"]), _corrected_deltas(t["corrected_deltas"]),
              *_corrected_rates(t["corrected_rates"]),
              _tests(t["group_tests"], "group-tests", "People's scores by race and gender",
                     "Kruskal-Wallis across races and Mann-Whitney White against every other "
                     "race pooled (the study's tests), and Kruskal-Wallis and Mann-Whitney "
                     "between genders, on each output's consensus score; Holm within each test "
                     "family.")]
    if len(t.get("group_means", [])):
        tables.append(_group_means(t["group_means"]))
    if len(t.get("arm_tests", [])):
        tables.append(_tests(t["arm_tests"], "arm-tests",
                             "Edited against feature-prompt output",
                             "Wilcoxon signed-rank on each item's within-rater difference "
                             "(feature − edited); Holm over the axes."))
    matches = t.get("survey_matches")
    if matches is not None and (matches["status"] != "matched").any():
        tables.append(_unmatched(matches))
    return {"simulated": bool(info.get("simulated")), "banner": SIMULATED_RATERS_BANNER,
            "summary": summary, "tables": tables}
