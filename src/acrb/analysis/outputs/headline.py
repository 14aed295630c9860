"""The headline metrics a person reads with ``dvc metrics show``, and the detailed ones kept.

``dvc metrics show`` prints one row per metrics file and one column per key, the union over
files, each as wide as its longest key. So the headline is laid out as rows that share short,
flat keys: one file per model and outcome (``metrics/audit/<model>/<outcome>.json``) holding,
per dimension, Δ (max − min rate, pooled over prompt categories; a text-to-image model's over
every prompt attribute, dimension ``all``) with its interval (keys ``race``, ``race_lb``,
``race_ub``, likewise ``gender``, ``age``, ``all``) and the number of flagged cells
(``flagged``, over every category and dimension); and one file per model
(``metrics/audit/<model>/summary.json``) with its request counts and the declared hypotheses
about it that are supported (``supported``: their names, space-separated, or ``none``; the
verdict of each is in the report and ``data/analysis/hypotheses.parquet``). Every value is a
finite number, a string or null, so the files are valid JSON.

Every flat metric the stage computes (rates per group and category, per-category Δ, judge and
feature-arm numbers, also what MLflow receives) is kept per model in
``data/analysis/<model>/metrics.csv`` (``metric``, ``value``; an empty value is a missing one),
read back by :func:`read_detailed_metrics`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from acrb.analysis.outcomes import OUTCOME_NAMES, OUTCOMES
from acrb.storage import atomic_write_text, read_csv, write_csv

#: The file of detailed metrics in each model's analysis folder.
DETAILED_METRICS = "metrics.csv"
#: Digits kept in the headline: 0.1 pp of a rate, enough to read and to diff.
DIGITS = 4


def headline_value(value: Any) -> float | None:
    """A finite float rounded to :data:`DIGITS`, or None for missing, NaN and infinities."""
    if value is None or value is pd.NA:
        return None
    number = float(value)
    # + 0.0 turns a rounded -0.0 (an interval bound at zero) into 0.0.
    return round(number, DIGITS) + 0.0 if math.isfinite(number) else None


def outcome_headline(disparities: pd.DataFrame, outcome: str, task: str = "i2i") -> dict[str, Any]:
    """One outcome's headline: Δ and its interval per dimension, and the flagged cell count.

    ``disparities`` is a model's disparity table (columns ``outcome``, ``dimension``,
    ``delta``, ``ci_low``, ``ci_high``, ``flagged``). An editor's (``task`` ``i2i``) has a
    ``category`` column: its rows pooled over prompt categories (``all``) give Δ per source
    dimension (race, gender, age). A text-to-image model's headline is its Δ over every prompt
    attribute (dimension ``all``); its Δ per prompt dimension stays in the detailed metrics,
    so the prompt dimensions do not widen every row of ``dvc metrics show``. ``flagged``
    counts every flagged row of the outcome, every category and dimension included.
    """
    rows = disparities[disparities["outcome"] == outcome]
    pooled = rows[rows["category" if task == "i2i" else "dimension"] == "all"]
    flagged = rows["flagged"].fillna(False).astype(bool)
    headline: dict[str, Any] = {"flagged": int(flagged.sum())}
    for row in pooled.to_dict("records"):
        headline.update(delta_keys(str(row["dimension"]), row))
    return headline


def delta_keys(dimension: str, row: Mapping[Any, Any]) -> dict[str, float | None]:
    """Δ of one dimension and its interval under the headline's keys (``race``, ``race_lb``,
    ``race_ub``), from a row with ``delta``, ``ci_low`` and ``ci_high``; with a
    ``delta_corrected`` (the editors' disparity tables), also the bias-corrected Δ
    (``race_corrected``)."""
    keys = {dimension: headline_value(row["delta"]),
            f"{dimension}_lb": headline_value(row["ci_low"]),
            f"{dimension}_ub": headline_value(row["ci_high"])}
    if "delta_corrected" in row:
        keys[f"{dimension}_corrected"] = headline_value(row["delta_corrected"])
    return keys


def model_summary(frame: pd.DataFrame, hypotheses: pd.DataFrame | None,
                  model: str) -> dict[str, Any]:
    """Request counts of ``model`` and the names of the hypotheses about it that are
    supported (``supported``: space-separated, ``none`` when none is)."""
    summary: dict[str, Any] = {
        "requests": len(frame),
        "errors": int((frame["status"] == "error").sum()),
        "missing": int((frame["status"] == "missing").sum()),
    }
    names: list[str] = []
    if hypotheses is not None:
        for row in hypotheses.to_dict("records"):
            if model in [m.strip() for m in str(row["model"]).split(",")]:
                supported = row["supported"]
                if supported is not None and not pd.isna(supported) and bool(supported):
                    names.append(str(row["hypothesis"]))
    summary["supported"] = " ".join(names) or "none"
    return summary


def headline_files(models: Mapping[str, tuple[pd.DataFrame, pd.DataFrame, str]],
                   hypotheses: pd.DataFrame | None) -> dict[Path, dict[str, Any]]:
    """The headline files, relative to the headline folder: ``<model>/<outcome>.json`` for every
    outcome the model measured and ``<model>/summary.json``.

    ``models`` maps a model name to (its analysis frame, its disparity table, its task:
    ``i2i`` or ``t2i``). An outcome file is named by the outcome's metric word
    (``refusal``, ``erasure``, ...), the word the MLflow keys use.
    """
    files: dict[Path, dict[str, Any]] = {}
    for model, (frame, disparities, task) in models.items():
        measured = set(disparities["outcome"])
        for outcome in [o for o in OUTCOMES if o in measured]:
            label = OUTCOME_NAMES[outcome].metric
            files[Path(model) / f"{label}.json"] = outcome_headline(disparities, outcome, task)
        files[Path(model) / "summary.json"] = model_summary(frame, hypotheses, model)
    return files


def dumps(value: Any) -> str:
    """JSON text of ``value``; NaN or infinity anywhere is an error, never written."""
    return json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_headline(folder: Path, files: Mapping[Path, Mapping[str, Any]]) -> None:
    """Replace the headline folder's JSON files by ``files`` (a model or outcome no longer
    analysed leaves no file behind)."""
    if folder.exists():
        for stale in folder.rglob("*.json"):
            if stale.relative_to(folder) not in files:
                stale.unlink()
    for relative, value in files.items():
        atomic_write_text(folder / relative, dumps(value))


def write_detailed_metrics(metrics: Mapping[str, float], path: Path) -> None:
    """Every flat metric of a model as a two-column CSV (``metric``, ``value``), sorted."""
    table = pd.DataFrame({"metric": sorted(metrics),
                          "value": [metrics[k] for k in sorted(metrics)]})
    write_csv(table, path, float_format="%.12g")


def read_detailed_metrics(path: Path) -> dict[str, float]:
    """The flat metrics written by :func:`write_detailed_metrics` (missing values as NaN)."""
    table = read_csv(path, keep_default_na=False, na_values=[""])
    # math.nan, one object, for every missing value: two reads compare equal as dicts.
    return {str(k): math.nan if pd.isna(v) else float(v)
            for k, v in zip(table["metric"], table["value"], strict=True)}
