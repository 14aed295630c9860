"""LaTeX tables (booktabs) of the audit's disparities and hypotheses, for papers.

This module only renders tables computed elsewhere (:mod:`acrb.analysis.outputs.section`,
:mod:`acrb.analysis.tests.hypotheses`). Each function returns the source of one ``table``
environment; ``\\usepackage{booktabs}`` is the only package the output needs. Percentages are
in percentage points with one decimal, p-values with three significant digits, as in the HTML
report.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import pandas as pd

from acrb.analysis.outcomes import outcome_phrase


def _escape(text: Any) -> str:
    value = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    for char, replacement in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"),
                              ("_", r"\_"), ("#", r"\#"), ("$", r"\$"), ("{", r"\{"),
                              ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        value = value.replace(char, replacement)
    return value.replace("Δ", r"$\Delta$").replace("χ²", r"$\chi^2$")


def _pp(value: Any) -> str:
    return "--" if value is None or pd.isna(value) else f"{100 * float(value):.1f}"


def _interval(low: Any, high: Any) -> str:
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return "--"
    return f"[{_pp(low)}, {_pp(high)}]"


def _p(value: Any) -> str:
    if value is None or pd.isna(value):
        return "--"
    value = float(value)
    return "$<0.001$" if value < 0.001 else f"{value:.3f}"


def _table(header: list[str], rows: list[list[str]], caption: str, label: str,
           align: str) -> str:
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{_escape(caption)}}}",
        rf"\label{{{label}}}",
        rf"\begin{{tabular}}{{{align}}}",
        r"\toprule",
        " & ".join(header) + r" \\",
        r"\midrule",
        *[" & ".join(row) + r" \\" for row in rows],
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def disparities_table(gaps: pd.DataFrame, model: str, outcome: str, confidence: float) -> str:
    """Δ per category and dimension of one model and outcome, with interval, groups and tests."""
    block = gaps[gaps["outcome"] == outcome]
    rows = [
        [
            _escape(row["category"]),
            _escape(row["dimension"]),
            _pp(row["delta"]),
            _interval(row["ci_low"], row["ci_high"]),
            _escape(row["max_group"]),
            _escape(row["min_group"]),
            _p(row["p_value"]),
            _p(row["p_adjusted"]),
            r"\textbf{yes}" if bool(row["flagged"]) else "no",
        ]
        for _, row in block.iterrows()
    ]
    header = ["Cat.", "Dim.", r"$\Delta$ (pp)", f"{round(100 * confidence)}\\% CI (pp)",
              "Highest", "Lowest", "$p$", r"$p_{\mathrm{Holm}}$", "Flagged"]
    caption = (f"{model}: disparity in {outcome_phrase(outcome)} rate "
               "(Δ = highest minus lowest group rate).")
    label = f"tab:{model}-{outcome}-delta".replace("_", "-")
    return _table(header, rows, caption, label, "llrlllrrl")


def hypotheses_table(hypotheses: pd.DataFrame) -> str:
    """The hypotheses table: one row per hypothesis (and model), with test and verdict."""
    rows = [
        [
            _escape(row["hypothesis"]),
            _escape(row["model"]),
            _escape(row["test"]),
            _escape(row["estimate_label"]),
            _escape(row["interval_label"]),
            _p(row["p_adjusted"]),
            _escape(row["verdict"]),
        ]
        for _, row in hypotheses.iterrows()
    ]
    header = ["", "Model", "Test", "Estimate", "Interval", r"$p_{\mathrm{Holm}}$", "Verdict"]
    return _table(header, rows, "Hypotheses, tests and verdicts.", "tab:hypotheses",
                  "lllrrrl")


def attribute_disparities_table(gaps: pd.DataFrame, planted: pd.DataFrame | None, model: str,
                                confidence: float,
                                equivalence: pd.DataFrame | None = None) -> str:
    """A text-to-image model's ACRB Δ of hard refusal over prompt attributes, per attribute
    family (all, then each dimension), with interval, extreme attributes, tests, the
    equivalence test's verdict and p (when ``equivalence`` is given:
    :func:`~acrb.analysis.experiments.attributes.attribute_equivalence`) and, for a simulated
    model, the planted Δ."""
    block = gaps[gaps["outcome"] == "hard_refusal"]
    tested: dict[str, dict[Hashable, Any]] = {}
    margin = None
    if equivalence is not None:
        rows_e = equivalence[equivalence["outcome"] == "hard_refusal"]
        tested = {str(r["dimension"]): r for r in rows_e.to_dict("records")}
        margins = set(rows_e["margin"])
        margin = float(margins.pop()) if len(margins) == 1 else None

    def no_gap(dimension: str) -> str:
        row = tested.get(dimension)
        if row is None or not math.isfinite(float(row["p_value"])):
            return "--"
        return f"{'yes' if row['equivalent'] else 'no'} ({_p(row['p_value'])})"

    truth = {}
    if planted is not None:
        rows_p = planted[(planted["outcome"] == "hard_refusal") & (planted["value"] == "Δ")]
        truth = dict(zip(rows_p["dimension"], rows_p["planted"], strict=True))
    rows = [
        [
            _escape(row["dimension"]),
            _pp(row["delta"]),
            _interval(row["ci_low"], row["ci_high"]),
            _escape(row["max_attribute"]),
            _escape(row["min_attribute"]),
            _p(row["p_value"]),
            _p(row["p_adjusted"]),
            r"\textbf{yes}" if bool(row["flagged"]) else "no",
            *([no_gap(str(row["dimension"]))] if tested else []),
            *([_pp(truth.get(row["dimension"]))] if truth else []),
        ]
        for _, row in block.iterrows()
    ]
    within = (f"Gap $<$ {100 * margin:.3g} pp ($p$)" if margin is not None
              else "No gap within the margin ($p$)")
    header = ["Attributes", r"$\Delta$ (pp)", f"{round(100 * confidence)}\\% CI (pp)",
              "Highest", "Lowest", "$p$", r"$p_{\mathrm{Holm}}$", "Flagged",
              *([within] if tested else []),
              *([r"Planted $\Delta$"] if truth else [])]
    caption = (f"{model}: ACRB disparity in refusal rate over prompt attributes "
               "(Δ = highest minus lowest attribute rate; intervals clustered on base prompt"
               + ("; no gap within the margin: paired TOST over base prompts on every pair of "
                  "attributes, intersection-union" if tested else "") + ").")
    label = f"tab:{model}-t2i-hard-refusal-delta".replace("_", "-")
    return _table(header, rows, caption, label,
                  "lrlllrrl" + ("l" if tested else "") + ("r" if truth else ""))


def judge_means_table(means: Mapping[str, pd.DataFrame], confidence: float) -> str:
    """The study's main table: mean ensemble score per rubric axis (columns) per model (rows),
    with the cluster-bootstrap interval below each mean; axes no model scored are left out.
    ``means``: model -> its :func:`acrb.analysis.agreement.judging.judge_means` table."""
    axes: list[str] = []
    for table in means.values():
        axes += [a for a in table.loc[table["n"] > 0, "axis"] if a not in axes]

    def cell(table: pd.DataFrame, axis: str) -> str:
        row = table.loc[table["axis"] == axis]
        if not len(row) or int(row["n"].iloc[0]) == 0:
            return "--"
        mean, low, high = (row[c].iloc[0] for c in ("mean", "ci_low", "ci_high"))
        interval = "" if pd.isna(low) else rf" \scriptsize[{low:.2f}, {high:.2f}]"
        return rf"\shortstack{{{mean:.2f}\\{interval}}}" if interval else f"{mean:.2f}"

    rows = [[_escape(model), *[cell(table, axis) for axis in axes]]
            for model, table in means.items()]
    header = ["Model", *[_escape(a.replace("_", " ")) for a in axes]]
    caption = (f"Mean judge score per axis (1--5; cue retention 0--1) over judged requests, "
               f"with {round(100 * confidence)}% cluster-bootstrap intervals over source images")
    return _table(header, rows, caption.replace("--", "-"), "tab:judge-means",
                  "l" + "c" * len(axes))


def booktabs_table(header: list[str], rows: list[list[str]], caption: str, label: str,
                   align: str, footer: str = "") -> str:
    """A booktabs table of plain-text cells (escaped here), with ``footer`` as a footnote-size
    paragraph under the tabular (the paper's tables name their run and inputs there)."""
    source = _table([_escape(h) for h in header], [[_escape(c) for c in row] for row in rows],
                    caption, label, align)
    if not footer:
        return source
    note = rf"\par\smallskip{{\footnotesize {_escape(footer)}}}"
    return source.replace("\\end{tabular}\n", "\\end{tabular}\n" + note + "\n", 1)
