"""One self-contained HTML report of an audit: rates, disparities, tests, figures, planted values.

This module only renders: every number arrives computed, in the model sections of
:mod:`acrb.analysis.outputs.section` and the hypotheses table of
:mod:`acrb.analysis.tests.hypotheses`; here it is formatted (percent, percentage points, p-values)
and laid out.

The report works offline and can be mailed as one file: CSS is inline, figures are embedded as
base64 ``data:`` URIs, and nothing is fetched from a network (no scripts, fonts or CDNs). The
Jinja2 template ships inside the package (``acrb/analysis/outputs/templates/report.html``) and is
rendered with autoescaping on. Results of simulated editors carry a banner, at the top and on
each simulated model, saying they are not measurements of real models.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from acrb.analysis.agreement.judging import ALL, ENSEMBLE, JudgingTables
from acrb.analysis.estimation.planted import DELTA_ROW
from acrb.analysis.outcomes import OUTCOMES, outcome_title
from acrb.analysis.outputs.findings import findings
from acrb.analysis.outputs.section import FigureRef, ModelSection
from acrb.analysis.outputs.t2i_section import AttributeSection
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.storage import atomic_write_text

SIMULATION_BANNER = (
    "SIMULATION — synthetic editors with planted biases; these are not measurements of real models"
)
T2I_SIMULATION_BANNER = (
    "SIMULATION — a synthetic generator with planted biases; these are not measurements of real "
    "models"
)

#: Run-info keys shown first, with their labels; any other keys follow in their own order.
RUN_INFO_LABELS: dict[str, str] = {
    "acrb_version": "ACRB version",
    "params_hash": "params hash",
    "profile": "profile",
}


def _is_missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _percent(value: Any) -> str:
    return "—" if _is_missing(value) else f"{100 * float(value):.1f}%"


def _points(value: Any) -> str:
    return "—" if _is_missing(value) else f"{100 * float(value):.1f}"


def _interval(low: Any, high: Any) -> str:
    if _is_missing(low) or _is_missing(high):
        return ""
    return f"[{100 * float(low):.1f}, {100 * float(high):.1f}]"


def _p_value(value: Any) -> str:
    if _is_missing(value):
        return "—"
    return "< 0.0001" if float(value) < 1e-4 else f"{float(value):.4f}"


def _tick(value: Any) -> str:
    if _is_missing(value):
        return "—"
    return "✓" if bool(value) else "✗"


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _group_label(group: Any, rates: pd.DataFrame, category: Any, dimension: Any) -> str:
    if _is_missing(group):
        return "—"
    match = rates.loc[
        (rates["category"] == category)
        & (rates["dimension"] == dimension)
        & (rates["value"] == group),
        "rate",
    ]
    return f"{group} ({_percent(match.iloc[0])})" if len(match) else str(group)


def _planted_row(row: Mapping[Any, Any]) -> dict[str, Any]:
    is_delta = row["value"] == DELTA_ROW
    # Δ is a difference of rates, shown in percentage points; group rates in percent.
    show = _points if is_delta else _percent
    return {
        "category": row["category"],
        "dimension": row["dimension"],
        "value": row["value"],
        "is_delta": is_delta,
        "planted": show(row["planted"]),
        "measured": show(row["measured"]),
        "interval": _interval(row["ci_low"], row["ci_high"]),
        "covered": _tick(row["covered"]),
        "missed": not _is_missing(row["covered"]) and not bool(row["covered"]),
    }


def _outcome_view(section: ModelSection, outcome: str) -> dict[str, Any]:
    rates = section.rates.loc[section.rates["outcome"] == outcome]
    gaps = section.disparities.loc[section.disparities["outcome"] == outcome]
    disparity_rows = [
        {
            "category": row["category"],
            "dimension": row["dimension"],
            "delta": _points(row["delta"]),
            "corrected": _points(row.get("delta_corrected", float("nan"))),
            "interval": _interval(row["ci_low"], row["ci_high"]),
            "max_group": _group_label(row["max_group"], rates, row["category"], row["dimension"]),
            "min_group": _group_label(row["min_group"], rates, row["category"], row["dimension"]),
            "n": int(row["n"]),
            "p_value": _p_value(row["p_value"]),
            "p_adjusted": _p_value(row["p_adjusted"]),
            "flagged": bool(row["flagged"]),
            "method": row["method"],
            "mde": "" if bool(row["flagged"]) or _is_missing(row.get("mde"))
            else _points(row["mde"]),
        }
        for row in gaps.to_dict("records")
    ]
    rate_rows = [
        {
            "category": row["category"],
            "dimension": row["dimension"],
            "value": row["value"],
            "n": int(row["n"]),
            "k": int(row["k"]),
            "rate": _percent(row["rate"]),
            "interval": _interval(row["ci_low"], row["ci_high"]),
        }
        for row in rates.to_dict("records")
    ]
    planted_rows: list[dict[str, Any]] = []
    planted_summary = ""
    if section.planted is not None:
        planted = section.planted.loc[section.planted["outcome"] == outcome]
        planted_rows = [_planted_row(row) for row in planted.to_dict("records")]
        is_delta = planted["value"] == DELTA_ROW
        known = planted["covered"].notna()
        planted_summary = (
            f"Δ intervals covering the planted Δ: "
            f"{int(planted.loc[is_delta & known, 'covered'].sum())} of "
            f"{int((is_delta & known).sum())}; group intervals covering the planted rate: "
            f"{int(planted.loc[~is_delta & known, 'covered'].sum())} of "
            f"{int((~is_delta & known).sum())} (group intervals are not simultaneous: a few "
            "misses are expected by chance)."
        )
    return {
        "name": outcome,
        "title": outcome_title(outcome),
        "disparities": disparity_rows,
        "flagged": sum(r["flagged"] for r in disparity_rows),
        "rates": rate_rows,
        "planted": [r for r in planted_rows if r["is_delta"]],
        "planted_groups": [r for r in planted_rows if not r["is_delta"]],
        "planted_summary": planted_summary,
        "figures": [
            {"caption": f.caption, "src": _data_uri(f.path)}
            for f in section.figures
            if f.outcome == outcome
        ],
    }


def _section_view(section: ModelSection) -> dict[str, Any]:
    outcomes = [o for o in OUTCOMES if o in set(section.disparities["outcome"])]
    outcomes += [o for o in dict.fromkeys(section.disparities["outcome"]) if o not in outcomes]
    known = set(outcomes)
    tests = [] if section.tests is None else [
        {"outcome": outcome_title(row["outcome"]),
         "dimension": row["dimension"], "test": row["test"],
         "statistic": "—" if _is_missing(row["statistic"]) else f"{row['statistic']:.2f}",
         "df": "—" if _is_missing(row["df"]) else f"{row['df']:.0f}",
         "p_value": _p_value(row["p_value"]), "p_adjusted": _p_value(row["p_adjusted"]),
         "significant": bool(row["significant"]) if not _is_missing(row["significant"])
         else False, "note": row["note"]}
        for row in section.tests.to_dict("records")
    ]
    return {
        "tests": tests,
        "slug": section.slug,
        "key": section.key,
        "simulated": section.simulated,
        "status_counts": [(s, int(c)) for s, c in section.status_counts.items()],
        "total": int(sum(section.status_counts.values())),
        "outcomes": [_outcome_view(section, o) for o in outcomes],
        "other_figures": [
            {"caption": f.caption, "src": _data_uri(f.path)}
            for f in section.figures
            if f.outcome not in known
        ],
    }


def _t2i_section_view(section: AttributeSection) -> dict[str, Any]:
    """A text-to-image model: Δ over prompt attributes, rates by attribute, planted values."""
    outcome = "hard_refusal"
    rates = section.rates.loc[section.rates["outcome"] == outcome]
    gaps = section.disparities.loc[section.disparities["outcome"] == outcome]
    rate_of = dict(zip(rates["attribute"], rates["rate"], strict=True))

    def label(attribute: Any) -> str:
        if _is_missing(attribute):
            return "—"
        return f"{attribute} ({_percent(rate_of.get(attribute))})"

    planted_of: dict[str, Any] = {}
    summary = ""
    planted_deltas: dict[str, Any] = {}
    if section.planted is not None:
        planted = section.planted.loc[section.planted["outcome"] == outcome]
        is_delta = planted["value"] == DELTA_ROW
        known = planted["covered"].notna()
        planted_of = {row["value"]: row for row in planted[~is_delta].to_dict("records")}
        planted_deltas = {row["dimension"]: row for row in planted[is_delta].to_dict("records")}
        summary = (
            f"Δ intervals covering the planted Δ: "
            f"{int(planted.loc[is_delta & known, 'covered'].sum())} of "
            f"{int((is_delta & known).sum())}; attribute intervals covering the planted rate: "
            f"{int(planted.loc[~is_delta & known, 'covered'].sum())} of "
            f"{int((~is_delta & known).sum())} (attribute intervals are not simultaneous: a few "
            "misses are expected by chance)."
        )
    disparities = []
    for row in gaps.to_dict("records"):
        truth = planted_deltas.get(row["dimension"])
        disparities.append({
            "dimension": row["dimension"], "attributes": int(row["attributes"]),
            "delta": _points(row["delta"]),
            "corrected": _points(row.get("delta_corrected", float("nan"))),
            "interval": _interval(row["ci_low"], row["ci_high"]),
            "max_attribute": label(row["max_attribute"]),
            "min_attribute": label(row["min_attribute"]), "n": int(row["n"]),
            "p_value": _p_value(row["p_value"]), "p_adjusted": _p_value(row["p_adjusted"]),
            "flagged": bool(row["flagged"]), "method": row["method"],
            "planted": "" if truth is None else _points(truth["planted"]),
            "covered": "" if truth is None else _tick(truth["covered"]),
            "missed": truth is not None and not _is_missing(truth["covered"])
            and not bool(truth["covered"]),
        })
    equivalence = []
    if section.equivalence is not None:
        for row in section.equivalence.loc[
                section.equivalence["outcome"] == outcome].to_dict("records"):
            tested = not _is_missing(row["p_value"])
            worst = ("—" if _is_missing(row["worst_a"])
                     else f"{row['worst_a']} − {row['worst_b']}"
                     + ("" if _is_missing(row["worst_diff"])
                        else f" ({_points(row['worst_diff'])} pp)"))
            equivalence.append({
                "dimension": row["dimension"], "attributes": int(row["attributes"]),
                "margin": _points(row["margin"]), "n": int(row["n_base_prompts"]),
                "worst": worst, "p_value": _p_value(row["p_value"]),
                "equivalent": bool(row["equivalent"]),
                "verdict": ((f"shown: every attribute gap is below {_points(row['margin'])} pp"
                             if row["equivalent"] else
                             f"not shown: a gap of {_points(row['margin'])} pp or more cannot "
                             "be excluded") if tested else f"not testable: {row['reason']}"),
            })
    rate_rows = []
    for row in rates.to_dict("records"):
        truth = planted_of.get(row["attribute"])
        rate_rows.append({
            "dimension": row["dimension"], "attribute": row["attribute"], "n": int(row["n"]),
            "clusters": int(row["n_clusters"]), "k": int(row["k"]),
            "rate": _percent(row["rate"]), "interval": _interval(row["ci_low"], row["ci_high"]),
            "deff": f"{row['deff']:.2f}",
            "planted": "" if truth is None else _percent(truth["planted"]),
            "covered": "" if truth is None else _tick(truth["covered"]),
            "missed": truth is not None and not _is_missing(truth["covered"])
            and not bool(truth["covered"]),
        })
    return {
        "slug": section.slug, "key": section.key, "simulated": section.simulated,
        "status_counts": [(s, int(c)) for s, c in section.status_counts.items()],
        "total": int(sum(section.status_counts.values())),
        "disparities": disparities, "rates": rate_rows, "equivalence": equivalence,
        "flagged": sum(r["flagged"] for r in disparities),
        "has_planted": section.planted is not None, "planted_summary": summary,
        "figures": [{"caption": f.caption, "src": _data_uri(f.path)} for f in section.figures],
    }


def _run_info_rows(run_info: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [
        (label, "—" if _is_missing(run_info.get(k)) else str(run_info[k]))
        for k, label in RUN_INFO_LABELS.items()
    ]
    rows += [(str(k), str(v)) for k, v in run_info.items() if k not in RUN_INFO_LABELS]
    return rows


def _template() -> jinja2.Template:
    text = (
        resources.files("acrb.analysis.outputs")
        .joinpath("templates", "report.html")
        .read_text(encoding="utf-8")
    )
    environment = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    return environment.from_string(text)


def _hypothesis_rows(hypotheses: pd.DataFrame | None) -> list[dict[str, Any]]:
    if hypotheses is None:
        return []
    return [
        {
            "hypothesis": row["hypothesis"], "claim": row["claim"], "model": row["model"],
            "test": row["test"], "estimate": row["estimate_label"],
            "interval": row["interval_label"], "p_value": _p_value(row["p_value"]),
            "p_adjusted": _p_value(row["p_adjusted"]), "verdict": row["verdict"],
            "supported": None if _is_missing(row["supported"]) else bool(row["supported"]),
            "note": row["note"],
        }
        for row in hypotheses.to_dict("records")
    ]


def _comparison_rows(models: list[ModelSection]) -> list[dict[str, Any]]:
    """One row per (outcome, category, dimension) with every model's Δ side by side."""
    frames = [m.disparities.assign(model=m.slug) for m in models]
    if not frames:
        return []
    gaps = pd.concat(frames, ignore_index=True)
    rows = []
    for (outcome, category, dimension), block in gaps.groupby(
        ["outcome", "category", "dimension"], sort=False
    ):
        cells = {}
        for row in block.to_dict("records"):
            cells[row["model"]] = {
                "delta": _points(row["delta"]),
                "value": float(row["delta"]) if not _is_missing(row["delta"]) else -1.0,
                "interval": _interval(row["ci_low"], row["ci_high"]),
                "flagged": bool(row["flagged"]),
            }
        rows.append({"outcome": outcome_title(str(outcome)), "category": category,
                     "dimension": dimension,
                     "cells": [cells.get(m.slug) for m in models]})
    return rows


def _score(value: Any, digits: int = 2) -> str:
    return "—" if _is_missing(value) else f"{float(value):.{digits}f}"


def _judge_means_view(judging: Mapping[str, JudgingTables]) -> dict[str, Any]:
    """The study's main table: one row per model, one column per axis any model scored."""
    axes: list[str] = []
    for tables in judging.values():
        axes += [a for a in tables.means.loc[tables.means["n"] > 0, "axis"] if a not in axes]
    rows = []
    for slug, tables in judging.items():
        means = {r["axis"]: r for r in tables.means.to_dict("records")}
        cells: list[dict[str, str]] = []
        for axis in axes:
            row = means.get(axis)
            if row is None or row["n"] == 0:
                cells.append({"mean": "—", "interval": "", "n": ""})
                continue
            interval = ("" if _is_missing(row["ci_low"])
                        else f"[{_score(row['ci_low'])}, {_score(row['ci_high'])}]")
            cells.append({"mean": _score(row["mean"]), "interval": interval,
                          "n": str(int(float(row["n"])))})
        rows.append({"model": slug, "judges": ", ".join(tables.judges), "cells": cells})
    return {"axes": axes, "rows": rows}


def _planted_judges_view(planted: pd.DataFrame | None) -> list[dict[str, str]]:
    """Rows of the simulated judges' planted error table (empty without simulated judges)."""
    if planted is None or planted.empty:
        return []
    return [{"judge": str(r["judge"]), "error": str(r["error"]).replace("_", " "),
             "group": "all" if r["dimension"] == "all" else f"{r['dimension']}: {r['group']}",
             "rate": f"{float(r['rate']):.2f}"} for r in planted.to_dict("records")]


def _judging_view(slug: str, tables: JudgingTables) -> dict[str, Any]:
    """One model's agreement, abstention and score-test tables, formatted."""
    agreement = tables.agreement
    pair = str(agreement["judges"].iloc[0]) if len(agreement) else ""
    first = agreement[agreement["judges"] == pair]
    axes = [a for a in dict.fromkeys(first["axis"])
            if first.loc[first["axis"] == a, "n_pairs"].sum() > 0]
    agreement_rows = []
    for (dimension, group), block in first.groupby(["dimension", "group"], sort=False):
        by_axis = block.set_index("axis")
        cells = []
        for axis in axes:
            row = by_axis.loc[axis]
            cells.append({"kappa": _score(row["kappa"]), "alpha": _score(row["alpha"]),
                          "n": int(row["n_pairs"]), "note": row["note"]})
        agreement_rows.append({"dimension": dimension, "group": group, "cells": cells})
    abstention_rows = []
    table = tables.abstention
    for (judge, event), block in table.groupby(["judge", "event"], sort=False):
        pooled = block[block["dimension"] == ALL].iloc[0]
        abstention_rows.append({
            "judge": judge if judge != ENSEMBLE else "ensemble", "event": event,
            "dimension": "all", "rates": f"{_percent(pooled['rate'])} of {int(pooled['n'])} "
            f"{_interval(pooled['ci_low'], pooled['ci_high'])}",
            "delta": "", "p_adjusted": "", "flagged": False})
        for dimension, rows in block[block["dimension"] != ALL].groupby("dimension", sort=False):
            asked = rows[rows["n"] > 0]
            p_adjusted = rows["p_adjusted"].iloc[0]
            abstention_rows.append({
                "judge": "", "event": "", "dimension": dimension,
                "rates": "; ".join(f"{r['group']} {_percent(r['rate'])}"
                                   for r in asked.to_dict("records")),
                "delta": _points(rows["delta"].iloc[0]), "p_adjusted": _p_value(p_adjusted),
                "flagged": not _is_missing(p_adjusted) and float(p_adjusted) < 0.05})
    tests = [
        {"axis": row["axis"], "dimension": row["dimension"], "test": row["test"],
         "statistic": _score(row["statistic"]), "df": _score(row["df"], 0),
         "p_value": _p_value(row["p_value"]), "p_adjusted": _p_value(row["p_adjusted"]),
         "significant": not _is_missing(row["significant"]) and bool(row["significant"]),
         "posthoc": row["posthoc"], "note": row["note"]}
        for row in tables.tests.to_dict("records")
    ]
    return {"slug": slug, "judges": ", ".join(tables.judges), "pair": pair,
            "agreement_axes": axes, "agreement": agreement_rows,
            "abstention": abstention_rows, "tests": tests}


def _sequential_view(summary: Mapping[str, Any]) -> dict[str, Any]:
    """One editor's sequential audit as the report's rows show it."""
    spent, design = summary["spent"], summary["design"]
    reasons = {"decided": "every declared Δ decided",
               "budget": f"budget spent ({summary['budget_limit']})"}
    return {
        "model": summary["model"],
        "stopped": f"after round {summary['stop_round']} of {summary['rounds_available']}",
        "reason": reasons.get(summary["reason"], summary["reason"]),
        "requests": f"{spent['requests']:,} of {design['requests']:,}",
        "saved": f"{100 * summary['saved_fraction']:.0f}%",
        "dollars": f"${spent['dollars']:,.2f} of ${design['dollars']:,.2f}",
        "gpu_hours": f"{spent['gpu_hours']:,.2f} of {design['gpu_hours']:,.2f}",
        "deltas": [{"name": d["name"], "claim": d["claim"],
                    "interval": "—" if d["lower"] is None
                    else f"[{d['lower']:.3f}, {d['upper']:.3f}]",
                    "decision": d["decision"],
                    "decided": str(d["decided_round"]) if d["decided_round"] else "—",
                    "flagged": d["decision"] == "gap"}
                   for d in summary["deltas"]],
    }


def render_report(
    models: list[ModelSection],
    run_info: dict[str, Any],
    path: Path,
    simulated: bool,
    *,
    simultaneous_intervals: bool = False,
    hypotheses: pd.DataFrame | None = None,
    comparison_figures: Sequence[FigureRef] = (),
    method: Mapping[str, Any] | None = None,
    t2i_models: Sequence[AttributeSection] = (),
    judging: Mapping[str, JudgingTables] | None = None,
    planted_judges: pd.DataFrame | None = None,
    review: dict[str, Any] | None = None,
    paper_tables: Sequence[Mapping[str, Any]] | None = None,
    sequential: Sequence[Mapping[str, Any]] = (),
    title: str = "ACRB audit report",
) -> Path:
    """Render the audit report for ``models`` to ``path`` (one self-contained HTML file).

    ``run_info`` holds the provenance shown at the top: ``acrb_version``, ``params_hash`` and
    ``profile`` first (shown as "—" when absent), then any other keys. With ``simulated`` the report
    opens with the simulation banner; each model section whose ``simulated`` flag is set repeats it.
    The file is written atomically (a temporary file in the same folder, then ``os.replace``).
    ``simultaneous_intervals`` says whether the Δ intervals were computed jointly per table (see
    :func:`acrb.analysis.estimation.resampling.clustered_disparities`); the text says so. The report
    opens with its findings (:mod:`acrb.analysis.outputs.findings`): per model one sentence on its
    flagged disparities and one on the hypotheses about it. ``t2i_models`` (text-to-image sections
    of :mod:`acrb.analysis.experiments.attributes`) get their own part: refusal by prompt attribute
    and the ACRB Δ over attributes. ``judging`` (model slug -> its judge tables,
    :mod:`acrb.analysis.agreement.judging`) adds the "Judges" part: the mean score per axis across
    models, then per model the judges' agreement by group, their abstention and the needs-review
    rate by group, and the tests of scores by group; without judges there is no such part.
    ``review`` (:func:`acrb.analysis.outputs.review_report.review_view`) adds the "Human review"
    part. ``paper_tables`` (:func:`acrb.analysis.outputs.paper_tables.read_paper_tables`) adds "The
    paper's tables". ``sequential`` (the summaries of :func:`acrb.rounds.summary`) adds
    "Sequential audit": per editor audited in rounds, when it stopped and why, what it spent
    against the whole design, and each declared Δ's final interval. Returns ``path``.
    """
    html = _template().render(
        title=title,
        findings=findings(models, t2i_models, hypotheses),
        banner=SIMULATION_BANNER,
        t2i_banner=T2I_SIMULATION_BANNER,
        simulated=simulated,
        simultaneous_intervals=simultaneous_intervals,
        hypotheses=_hypothesis_rows(hypotheses),
        comparison=_comparison_rows(models),
        comparison_figures=[{"caption": f.caption, "src": _data_uri(f.path)}
                            for f in comparison_figures],
        method=dict(method or {}),
        run_info=_run_info_rows(run_info),
        models=[_section_view(m) for m in models],
        t2i_models=[_t2i_section_view(m) for m in t2i_models],
        dimensions=list(SOURCE_DIMENSIONS),
        judge_means=_judge_means_view(judging or {}),
        judging=[_judging_view(slug, t) for slug, t in (judging or {}).items()],
        planted_judges=_planted_judges_view(planted_judges),
        review=review,
        paper_tables=list(paper_tables or []),
        sequential=[_sequential_view(summary) for summary in sequential],
    )
    path = Path(path)
    atomic_write_text(path, html)
    return path
