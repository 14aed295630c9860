"""One model's section of the audit: every table and figure the report shows about it.

:func:`build_model_section` computes, for one model's analysis frame, the group rates of every
outcome, the disparity table (cluster-robust with a bootstrap, else counting requests as
independent), the gap each row could have detected, planted against measured values for a
simulated model, the tests across categories (:func:`model_tests`) and the figures. The
``analyze`` stage writes the result as tables; the HTML report (:mod:`acrb.analysis.outputs.report`)
and the LaTeX tables (:mod:`acrb.analysis.outputs.latex`) only render it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.disparity import disparities
from acrb.analysis.estimation.planted import PLANTED_COLUMNS, has_planted, planted_vs_measured
from acrb.analysis.estimation.power import detectable_gap
from acrb.analysis.estimation.rates import group_rates
from acrb.analysis.estimation.resampling import (
    GroupTest,
    Resample,
    clustered_disparities,
    clustered_rates,
)
from acrb.analysis.outcomes import OUTCOMES, outcome_title
from acrb.analysis.outputs.figures import delta_bars, rate_heatmap
from acrb.analysis.tests.contingency import cmh_test
from acrb.analysis.tests.gee import gee_group_test
from acrb.analysis.tests.pvalues import adjust
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.errors import InputDataError
from acrb.storage import atomic_write_json, write_parquet

#: Generation statuses the section always counts, in this order (others follow as found).
STATUSES: tuple[str, ...] = ("ok", "refused", "error")

#: Columns of :func:`model_tests`.
TEST_COLUMNS: tuple[str, ...] = ("outcome", "dimension", "test", "statistic", "df", "p_value",
                                 "p_adjusted", "significant", "note")

#: The outcomes :func:`model_tests` tests by default: the two the seed study's claims are about.
TESTED_OUTCOMES: tuple[str, ...] = ("hard_refusal", "erasure")


@dataclass(frozen=True)
class FigureRef:
    """A PNG to embed: the outcome it belongs to ("" for none), a caption and its path."""

    outcome: str
    caption: str
    path: Path


@dataclass(frozen=True)
class ModelSection:
    """Everything the report shows about one model.

    ``rates``, ``disparities`` and ``planted`` hold all outcomes, concatenated (the outputs of
    :func:`~acrb.analysis.estimation.rates.group_rates`, of
    :func:`~acrb.analysis.estimation.resampling.clustered_disparities` or
    :func:`~acrb.analysis.estimation.disparity.disparities`, and of
    :func:`~acrb.analysis.estimation.planted.planted_vs_measured`); ``planted`` is None for real
    models. ``status_counts`` counts requests by generation status (ok / refused / error).
    """

    slug: str
    key: str
    simulated: bool
    status_counts: Mapping[str, int]
    rates: pd.DataFrame
    disparities: pd.DataFrame
    planted: pd.DataFrame | None = None
    figures: Sequence[FigureRef] = field(default_factory=tuple)
    #: Tests across categories (:func:`model_tests`), if computed.
    tests: pd.DataFrame | None = None


def build_model_section(
    frame: pd.DataFrame,
    slug: str,
    key: str,
    simulated: bool,
    figure_dir: Path,
    confidence: float = 0.95,
    alpha: float = 0.05,
    *,
    simultaneous: bool = False,
    permutations: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
    bootstrap: int | None = None,
    resample: Resample = "auto",
    test: GroupTest = "between-groups",
    power: float | None = None,
    tests: bool = True,
    draw_figures: bool = True,
) -> ModelSection:
    """Compute one model's section: rates, disparities, planted-vs-measured (if the frame has
    planted columns), the tests across categories and the figures (written under
    ``figure_dir`` as ``{slug}-{outcome}-….png``; with ``draw_figures`` False they are listed
    but not drawn, and :func:`section_figure_jobs` draws them, e.g. in other processes).

    Rates and intervals are at ``confidence`` (with ``bootstrap``, each group's rate interval is at
    the design's clustering, :func:`acrb.analysis.estimation.resampling.clustered_rates`; without,
    it counts requests as independent); rows are flagged at family-wise error rate ``alpha`` (Holm).
    With ``bootstrap`` (a number of resamples) the disparities are cluster-robust
    (:func:`acrb.analysis.estimation.resampling.clustered_disparities`: cluster-bootstrap intervals,
    permutation tests over sources with ``permutations`` and ``seed``, ``resample`` saying which
    units are resampled), as the pipeline reports them; without, they count requests as independent
    (:func:`acrb.analysis.estimation.disparity.disparities`), a quick table for checks. With
    ``power``, each row also gets ``mde``, the gap detectable at that power for its design
    (:func:`acrb.analysis.estimation.power.detectable_gap`). With ``tests``, the section carries
    :func:`model_tests` at ``alpha`` of the :data:`TESTED_OUTCOMES` the frame has (the frame then
    needs ``source_id``).
    """
    outcomes = [o for o in OUTCOMES if o in frame.columns]
    rate_table = group_rates if bootstrap is None else clustered_rates
    rates = pd.concat([rate_table(frame, o, confidence) for o in outcomes], ignore_index=True)
    if bootstrap is None:
        tables = [
            disparities(frame, o, confidence, alpha, simultaneous=simultaneous,
                        permutations=permutations, seed=seed)
            for o in outcomes
        ]
    else:
        tables = [
            clustered_disparities(frame, o, confidence, alpha, bootstrap, permutations, seed,
                                  simultaneous, resample=resample, test=test)
            for o in outcomes
        ]
    gaps = pd.concat(tables, ignore_index=True)
    if power is not None:
        categories = frame["category"].astype(str)
        by_category = {category: frame.loc[categories == category]
                       for category in set(gaps["category"]) if category != "all"}
        gaps["mde"] = [
            detectable_gap(frame if row.category == "all" else by_category[row.category],
                           str(row.outcome), str(row.dimension), alpha, power)
            for row in gaps.itertuples(index=False)
        ]
    planted = None
    if has_planted(frame):
        # Judge outcomes have no planted probability of their own: only the detectors' do.
        planted = pd.concat(
            [planted_vs_measured(frame, rates, gaps, o) for o in outcomes
             if o in PLANTED_COLUMNS], ignore_index=True
        )
    jobs = _figure_jobs(slug, outcomes, rates, gaps, planted, Path(figure_dir))
    if draw_figures:
        for _, draw in jobs:
            draw()
    figures = [figure for figure, _ in jobs]
    counts = frame["status"].value_counts()
    status_counts = {s: int(counts.get(s, 0)) for s in STATUSES}
    status_counts.update({str(s): int(c) for s, c in counts.items() if s not in STATUSES})
    tested = tuple(o for o in TESTED_OUTCOMES if o in frame.columns)
    return ModelSection(slug, key, simulated, status_counts, rates, gaps, planted, tuple(figures),
                        model_tests(frame, alpha, tested) if tests else None)


def _figure_jobs(slug: str, outcomes: Sequence[str], rates: pd.DataFrame, gaps: pd.DataFrame,
                 planted: pd.DataFrame | None, figure_dir: Path
                 ) -> list[tuple[FigureRef, Callable[[], Path]]]:
    """Each figure of a section, in the section's order: its reference, and a call that
    draws it (a picklable :func:`functools.partial`)."""
    jobs: list[tuple[FigureRef, Callable[[], Path]]] = []
    for outcome in outcomes:
        title = outcome_title(outcome)
        path = figure_dir / f"{slug}-{outcome}-delta.png"
        jobs.append((FigureRef(outcome, f"Δ by category and dimension ({title.lower()})", path),
                     functools.partial(delta_bars, gaps, outcome, f"{slug}: Δ {title.lower()}",
                                       path, planted=planted)))
        for dimension in SOURCE_DIMENSIONS:
            path = figure_dir / f"{slug}-{outcome}-{dimension}.png"
            jobs.append((FigureRef(outcome, f"{title} rate by {dimension} and category", path),
                         functools.partial(rate_heatmap, rates, outcome, dimension,
                                           f"{slug}: {title.lower()} by {dimension}", path)))
    return jobs


def section_figure_jobs(section: ModelSection, figure_dir: Path) -> list[Callable[[], Path]]:
    """The calls that draw ``section``'s figures under ``figure_dir`` (as
    :func:`build_model_section` does; each draws one figure and returns its path), for a
    section built with ``draw_figures=False``."""
    outcomes = list(dict.fromkeys(figure.outcome for figure in section.figures))
    return [draw for _, draw in _figure_jobs(section.slug, outcomes, section.rates,
                                             section.disparities, section.planted,
                                             Path(figure_dir))]


def model_tests(frame: pd.DataFrame, alpha: float,
                outcomes: tuple[str, ...] = TESTED_OUTCOMES) -> pd.DataFrame:
    """Tests of outcome x group across all prompt categories for one model, Holm over the table.

    Per outcome and source dimension: the Cochran-Mantel-Haenszel test with categories as strata
    (generalized CMH for more than two groups), and a logistic GEE clustered on source image, ``y ~
    C(group) * C(category)``: robust score tests of every group term (does the group matter in any
    category?), of the interaction alone (does its effect differ between categories?) and of the
    group in the additive model (a common effect). See
    :func:`acrb.analysis.tests.contingency.cmh_test` and
    :func:`acrb.analysis.tests.gee.gee_group_test`; CMH counts requests as independent and is a
    descriptive screen.
    """
    rows: list[dict[str, Any]] = []
    for outcome in outcomes:
        for dimension in SOURCE_DIMENSIONS:
            cmh = cmh_test(frame, outcome, dimension)
            rows.append({"outcome": outcome, "dimension": dimension,
                         "test": "CMH across categories", "statistic": cmh.statistic,
                         "df": cmh.df, "p_value": cmh.p_value, "note": cmh.reason or ""})
            gee = gee_group_test(frame, outcome, dimension)
            for label, statistic, df, p_value, reason in (
                ("GEE: group, any category", gee.statistic, gee.df, gee.p_value, gee.reason),
                ("GEE: group x category", gee.interaction_statistic, gee.interaction_df,
                 gee.interaction_p_value, gee.interaction_reason),
                ("GEE: common group effect", gee.main_statistic, gee.main_df, gee.main_p_value,
                 gee.main_reason),
            ):
                rows.append({"outcome": outcome, "dimension": dimension, "test": label,
                             "statistic": statistic, "df": df, "p_value": p_value,
                             "note": reason or ""})
    table = pd.DataFrame(rows)
    adjusted = adjust(table["p_value"].to_numpy(dtype=float), "holm")
    table["p_adjusted"] = adjusted
    table["significant"] = pd.array(
        [None if not np.isfinite(p) else bool(p < alpha) for p in adjusted], dtype="boolean")
    return table[list(TEST_COLUMNS)]


def write_section(section: ModelSection, folder: Path, root: Path) -> None:
    """Write a model's section as `analyze` leaves it for the report: its tables as Parquet
    and ``section.json`` (status counts, the figures' captions and paths relative to
    ``root``). Each file is written atomically; :func:`read_section` reads them back."""
    if section.tests is not None:
        write_parquet(section.tests, folder / "tests.parquet")
    write_parquet(section.rates, folder / "rates.parquet")
    write_parquet(section.disparities, folder / "disparities.parquet")
    if section.planted is not None:
        write_parquet(section.planted, folder / "planted_vs_measured.parquet")
    atomic_write_json(folder / "section.json", {
        "slug": section.slug, "key": section.key, "simulated": section.simulated,
        "status_counts": dict(section.status_counts),
        "figures": [{"outcome": f.outcome, "caption": f.caption,
                     "path": str(Path(f.path).resolve().relative_to(root))}
                    for f in section.figures],
    })


def read_section(folder: Path, root: Path) -> ModelSection:
    """Rebuild a model's section from the files :func:`write_section` wrote in ``folder``."""
    index_path = folder / "section.json"
    if not index_path.exists():
        raise InputDataError(f"{index_path} not found", "run `acrb analyze` (or `dvc repro`)")
    index = json.loads(index_path.read_text())
    planted_path = folder / "planted_vs_measured.parquet"
    tests_path = folder / "tests.parquet"
    return ModelSection(
        slug=index["slug"], key=index["key"], simulated=index["simulated"],
        status_counts=index["status_counts"],
        rates=pd.read_parquet(folder / "rates.parquet"),
        disparities=pd.read_parquet(folder / "disparities.parquet"),
        planted=pd.read_parquet(planted_path) if planted_path.exists() else None,
        tests=pd.read_parquet(tests_path) if tests_path.exists() else None,
        figures=tuple(FigureRef(f["outcome"], f["caption"], root / f["path"])
                      for f in index["figures"]),
    )
