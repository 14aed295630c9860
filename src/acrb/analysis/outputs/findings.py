"""The findings the report opens with: per model, one sentence on its flagged disparities and
one on the hypotheses, written from the same tables the report's sections show.

A disparity is flagged when its Holm-corrected test rejects (the ``flagged`` column of the
disparity tables, :mod:`acrb.analysis.estimation.resampling`); the sentence gives each flagged Δ in
percentage points with its interval: those pooled over prompt categories first, then the
largest. A simulated model is named as what it is:
an instrument with planted values, not a measurement of a real model.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pandas as pd

from acrb.analysis.outcomes import outcome_phrase
from acrb.analysis.outputs.section import ModelSection
from acrb.analysis.outputs.t2i_section import AttributeSection

#: Flagged disparities named in a sentence; the rest are counted.
LISTED = 4
SIMULATED_LABEL = "a simulated instrument with planted values, not a measurement of a real model"


def _pp(value: Any) -> str:
    number = float(value)
    return "—" if not math.isfinite(number) else f"{100 * number:.1f}"


def _cell(row: Mapping[Hashable, Any]) -> str:
    """Where the gap is: its dimension, and its prompt category (editors) or that the groups
    are prompt attributes (text-to-image)."""
    if "category" not in row:
        if row["dimension"] == "all":
            return "over every prompt attribute"
        return f"by {row['dimension']} (prompt attributes)"
    category = row["category"]
    if category == "all":
        return f"by {row['dimension']} pooled over prompt categories"
    return f"by {row['dimension']} in prompt category {category}"


def disparity_sentence(slug: str, disparities: pd.DataFrame, simulated: bool) -> str:
    """One sentence: which disparities of ``slug`` are flagged, how large, with intervals."""
    who = f"{slug} ({SIMULATED_LABEL})" if simulated else slug
    flagged = disparities[disparities["flagged"].fillna(False).astype(bool)]
    if flagged.empty:
        return f"{who}: no disparity is flagged (every Δ is within chance after correction)."
    # Gaps pooled over prompt categories first (the headline cells), then the largest.
    pooled = (flagged["category"] != "all") if "category" in flagged else False
    rows = flagged.assign(_cell=pooled).sort_values(
        ["_cell", "delta"], ascending=[True, False]).drop(columns="_cell").to_dict("records")
    parts = [
        f"Δ {outcome_phrase(str(r['outcome']))} {_cell(r)} "
        f"{_pp(r['delta'])} pp [{_pp(r['ci_low'])}, {_pp(r['ci_high'])}]"
        for r in rows[:LISTED]
    ]
    more = len(rows) - LISTED
    tail = f"; and {more} more (see the model's section)" if more > 0 else ""
    noun = "disparity is" if len(rows) == 1 else "disparities are"
    return f"{who}: {len(rows)} {noun} flagged: " + "; ".join(parts) + tail + "."


def hypothesis_sentence(slug: str, hypotheses: pd.DataFrame | None) -> str:
    """One sentence: the declared hypotheses about ``slug``, supported and not."""
    if hypotheses is None or hypotheses.empty:
        return ""
    mine = hypotheses[[slug in [m.strip() for m in str(m_).split(",")]
                       for m_ in hypotheses["model"]]]
    if mine.empty:
        return ""
    supported = [str(h) for h, s in zip(mine["hypothesis"], mine["supported"], strict=True)
                 if not pd.isna(s) and bool(s)]
    others = [str(h) for h in mine["hypothesis"] if str(h) not in supported]
    said = ", ".join(supported) if supported else "none"
    rest = f"; not supported: {', '.join(others)}" if others else ""
    return f"Hypotheses supported for {slug}: {said}{rest}."


def findings(models: Sequence[ModelSection], t2i_models: Sequence[AttributeSection] = (),
             hypotheses: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """Per model (editors, then text-to-image models): its slug, whether it is simulated, the
    disparity sentence and the hypothesis sentence (empty when no hypothesis is about it)."""
    rows = []
    sections: list[ModelSection | AttributeSection] = [*models, *t2i_models]
    for section in sections:
        rows.append({
            "slug": section.slug,
            "simulated": section.simulated,
            "disparities": disparity_sentence(section.slug, section.disparities,
                                              section.simulated),
            "hypotheses": hypothesis_sentence(section.slug, hypotheses),
        })
    return rows
