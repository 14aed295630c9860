"""The analysis frame: one row per planned request of one model, and which of its rows count.

Columns: ``request_id, source_id, prompt_id, category, congruence, seed, race, gender, age``
(the request's design, from the plan), ``status`` (``ok``, ``refused``, ``error`` from the
generation, ``missing`` when no judgement exists yet) and the boolean outcomes of
:mod:`acrb.analysis.outcomes`, NA where an outcome is not observed. The ``analyze`` stage builds
it once, as an :class:`AnalysisFrame`; every statistic of :mod:`acrb.analysis` reads it through
the functions here, so that "which requests count" has one answer: a request counts when the
model answered it (status ``ok`` or ``refused``) and the outcome in question was observed. An
``error`` (crash, timeout) is never a refusal, and a request not judged yet is not a rate's
zero.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pandas as pd

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError

#: Request statuses whose rows carry outcomes: an ``error`` or ``missing`` request has none.
USABLE_STATUSES: tuple[str, ...] = ("ok", "refused")

#: The column that names the source image, the cluster of every clustered method.
CLUSTER_COLUMN = "source_id"

#: The pseudo-category that pools every prompt category.
ALL_CATEGORIES = "all"


def check_columns(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    """Raise :class:`InputDataError` naming the columns the analysis frame lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputDataError(
            f"analysis frame lacks column(s) {', '.join(missing)}",
            "build the frame from the evaluate stage's judgements joined with requests and sources",
        )


def usable_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows that count: status in :data:`USABLE_STATUSES` (the model answered)."""
    return frame.loc[frame["status"].isin(USABLE_STATUSES)]


def category_levels(frame: pd.DataFrame) -> list[str]:
    """The categories a breakdown reports: ``"all"`` first, then the frame's categories sorted.

    Taken from every row (errored ones included), so a category whose requests all errored still
    appears, with n = 0.
    """
    present = sorted({str(c) for c in frame["category"].dropna().unique()})
    return [ALL_CATEGORIES, *[c for c in present if c != ALL_CATEGORIES]]


def check_dimension(dimension: str) -> tuple[str, ...]:
    """The vocabulary of a source ``dimension``; ValueError for a dimension that is not one."""
    if dimension not in SOURCE_DIMENSIONS:
        raise ValueError(
            f"unknown dimension '{dimension}'; expected one of {sorted(SOURCE_DIMENSIONS)}"
        )
    return SOURCE_DIMENSIONS[dimension]


def check_single_model(frame: pd.DataFrame) -> None:
    """ValueError when ``frame`` pools several models (a ``model`` column with two values)."""
    if "model" in frame.columns and frame["model"].nunique(dropna=True) > 1:
        raise ValueError(
            "the frame pools several models; pass one model's rows "
            "(or use model_interaction_test to compare models)"
        )


#: The columns every analysis frame has, whatever its task: each request's status, which says
#: whether it counts (:func:`usable_rows`).
FRAME_COLUMNS: tuple[str, ...] = ("status",)


class AnalysisFrame(pd.DataFrame):
    """One model's analysis frame, checked once, where it is made (:func:`checked_frame`): it
    has :data:`FRAME_COLUMNS` and one model's rows only. A statistic given one takes it as it
    is; given a plain DataFrame (built by hand, say) it checks it first. Rows selected from an
    AnalysisFrame and columns added to it stay an AnalysisFrame (pandas' ``_constructor``): a
    subset of one model's rows is still one model's. Which outcome or dimension a statistic
    reads is its argument, and each statistic still checks that column is there
    (:func:`check_columns`)."""

    @property
    def _constructor(self) -> type[AnalysisFrame]:
        return AnalysisFrame


def checked_frame(frame: pd.DataFrame) -> AnalysisFrame:
    """``frame`` as an :class:`AnalysisFrame` (the same data, not a copy): returned as it is
    when it is one, else checked: :class:`InputDataError` naming a missing
    :data:`FRAME_COLUMNS` column, ValueError when it pools several models."""
    if isinstance(frame, AnalysisFrame):
        return frame
    check_columns(frame, FRAME_COLUMNS)
    check_single_model(frame)
    return AnalysisFrame(frame)


def group_series(rows: pd.DataFrame, dimension: str) -> pd.Series:
    """The dimension as a categorical in vocabulary order; values outside it become NaN (with a
    warning naming them)."""
    vocabulary = check_dimension(dimension)
    values = rows[dimension].astype("string")
    unknown = sorted(set(values.dropna().unique()) - set(vocabulary))
    if unknown:
        warnings.warn(
            f"{dimension} value(s) {unknown} are not in the ACRB vocabulary and are left out",
            stacklevel=3,
        )
    return pd.Series(
        pd.Categorical(values.astype(object), categories=list(vocabulary)), index=rows.index
    )


def outcome_rows(
    frame: pd.DataFrame, outcome: str, dimension: str, extra: Sequence[str] = ()
) -> pd.DataFrame:
    """Usable rows with the outcome observed and a known group: columns ``y`` (0/1 float),
    ``group`` (categorical keeping only the groups present), ``category`` and the ``extra``
    columns."""
    check_dimension(dimension)
    check_columns(frame, ["status", "category", dimension, outcome, *extra])
    usable = usable_rows(frame)
    observed = usable[outcome].astype("boolean")
    group = group_series(usable, dimension)
    keep = observed.notna().to_numpy() & group.notna().to_numpy()
    rows = pd.DataFrame(
        {
            "y": observed[keep].to_numpy(dtype=float),
            "group": group[keep].cat.remove_unused_categories().array,
            "category": usable["category"][keep].astype(str).to_numpy(),
        }
    )
    for column in extra:
        rows[column] = usable[column][keep].to_numpy()
    return rows
