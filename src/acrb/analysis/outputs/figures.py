"""Figures of rates and disparities, written as PNG files.

Each function draws on its own :class:`matplotlib.figure.Figure` (no pyplot state, no display),
with seaborn's styling applied in a context so global settings are left alone, writes the PNG
atomically and returns its path. Output is deterministic for fixed inputs and library versions
(no timestamps in the PNG metadata). matplotlib and seaborn are imported when the first figure
is drawn (:func:`plotting`), not with this module.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from acrb.demographics import SOURCE_DIMENSIONS
from acrb.storage import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
_STYLE = "whitegrid"
_CONTEXT = "notebook"
_PNG_METADATA = {"Software": None}


@functools.cache
def plotting() -> ModuleType:
    """seaborn, imported on first use with matplotlib's headless backend chosen first (figures
    are only ever written to files). Importing seaborn (and the scipy.stats it imports) takes
    about 2 s, which the stages that only read the figures' paths (report, tables) need not
    pay."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn

    return seaborn


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure of ``figsize`` inches that belongs to no pyplot state."""
    plotting()
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _save(figure: Figure, path: Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=DPI, metadata=_PNG_METADATA, bbox_inches="tight")
    return path


def _ordered_categories(values: pd.Series) -> list[str]:
    return list(dict.fromkeys(values.astype(str)))


def rate_heatmap(rates: pd.DataFrame, outcome: str, dimension: str, title: str, path: Path) -> Path:
    """Heatmap of an outcome's rate: source groups (rows) x prompt categories (columns).

    ``rates`` is the output of :func:`acrb.analysis.estimation.rates.group_rates` (several outcomes
    may be concatenated). Cells are annotated with the rate in percent and n; groups without
    observations are grey. The colour scale runs from 0 to the largest rate shown.
    """
    sns = plotting()
    block = rates.loc[(rates["outcome"] == outcome) & (rates["dimension"] == dimension)]
    if block.empty:
        raise ValueError(f"no rates for outcome '{outcome}' and dimension '{dimension}'")
    categories = _ordered_categories(block["category"])
    groups = [v for v in SOURCE_DIMENSIONS.get(dimension, ()) if v in set(block["value"])]
    groups += [v for v in _ordered_categories(block["value"]) if v not in groups]
    rate = block.pivot(index="value", columns="category", values="rate").reindex(
        index=groups, columns=categories
    )
    n = block.pivot(index="value", columns="category", values="n").reindex(
        index=groups, columns=categories
    )
    labels = np.array(
        [
            [
                f"{100 * r:.1f}%\nn={int(c)}" if np.isfinite(r) else ""
                for r, c in zip(rr, cc, strict=True)
            ]
            for rr, cc in zip(rate.to_numpy(dtype=float), n.to_numpy(dtype=float), strict=True)
        ],
        dtype=object,
    )
    highest = float(np.nanmax(rate.to_numpy(dtype=float))) if rate.notna().any().any() else 0.0
    with sns.axes_style("white"), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((1.3 + 1.05 * len(categories), 1.0 + 0.55 * len(groups)))
        axes = figure.add_subplot()
        axes.set_facecolor("#e6e6e6")  # shows through the cells of groups without data
        sns.heatmap(
            rate * 100,
            ax=axes,
            annot=labels,
            fmt="",
            cmap="rocket_r",
            vmin=0.0,
            vmax=max(100 * highest, 1.0),
            linewidths=0.5,
            linecolor="white",
            cbar_kws={"label": f"{outcome.replace('_', ' ')} rate (%)"},
        )
        axes.set_xlabel("prompt category")
        axes.set_ylabel(dimension)
        axes.set_title(title)
        axes.tick_params(axis="y", rotation=0)
        return _save(figure, path)


def delta_bars(
    disparities: pd.DataFrame,
    outcome: str,
    title: str,
    path: Path,
    planted: pd.DataFrame | None = None,
) -> Path:
    """Grouped bars of Δ (percentage points) per prompt category, one bar per dimension.

    ``disparities`` is the output of :func:`acrb.analysis.estimation.disparity.disparities`. Error
    bars are the simultaneous Δ intervals; a flagged Δ (Holm-adjusted p < alpha) is marked with a
    star above its bar. ``planted`` (optional) holds planted Δ values, either as the output of
    :func:`acrb.analysis.estimation.planted.planted_vs_measured` (its ``"Δ"`` rows are used) or as
    any frame with columns ``category, dimension, planted``; they are drawn as black diamonds.
    """
    sns = plotting()
    block = disparities.loc[disparities["outcome"] == outcome]
    if block.empty:
        raise ValueError(f"no disparities for outcome '{outcome}'")
    categories = _ordered_categories(block["category"])
    dimensions = [d for d in SOURCE_DIMENSIONS if d in set(block["dimension"])]
    dimensions += [d for d in _ordered_categories(block["dimension"]) if d not in dimensions]
    planted_delta: dict[tuple[str, str], float] = {}
    if planted is not None:
        rows = planted
        if "value" in rows.columns:
            rows = rows.loc[rows["value"] == "Δ"]
        if "outcome" in rows.columns:
            rows = rows.loc[rows["outcome"] == outcome]
        planted_delta = {
            (str(c), str(d)): float(p)
            for c, d, p in rows[["category", "dimension", "planted"]].itertuples(index=False)
        }
    indexed = block.set_index(["category", "dimension"])
    width = 0.8 / max(len(dimensions), 1)
    palette = sns.color_palette("colorblind", len(dimensions))
    x = np.arange(len(categories))
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((1.6 + 1.1 * len(categories), 3.6))
        axes = figure.add_subplot()
        for d, dimension in enumerate(dimensions):
            keys = [(c, dimension) for c in categories]
            present = indexed.reindex(keys)
            delta = 100 * present["delta"].to_numpy(dtype=float)
            low = 100 * present["ci_low"].to_numpy(dtype=float)
            high = 100 * present["ci_high"].to_numpy(dtype=float)
            flagged = present["flagged"].fillna(False).to_numpy(dtype=bool)
            offset = x - 0.4 + width * (d + 0.5)
            errors = np.vstack([np.clip(delta - low, 0, None), np.clip(high - delta, 0, None)])
            axes.bar(
                offset,
                np.nan_to_num(delta),
                width * 0.92,
                yerr=np.nan_to_num(errors),
                color=palette[d],
                label=dimension,
                capsize=2,
                error_kw={"elinewidth": 0.9, "ecolor": "0.25"},
            )
            for xi, top, flag in zip(offset, high, flagged, strict=True):
                if flag:
                    axes.annotate(
                        "*",
                        (xi, np.nan_to_num(top)),
                        ha="center",
                        va="bottom",
                        fontsize=12,
                        fontweight="bold",
                    )
            if planted_delta:
                marks = np.array([planted_delta.get(key, np.nan) for key in keys], dtype=float)
                axes.scatter(
                    offset,
                    100 * marks,
                    marker="D",
                    s=22,
                    color="black",
                    zorder=3,
                    label="planted Δ" if d == 0 else None,
                )
        axes.set_xticks(x, categories)
        axes.set_xlabel("prompt category")
        axes.set_ylabel(f"Δ {outcome.replace('_', ' ')} (pp)")
        tops = 100 * block[["delta", "ci_high"]].to_numpy(dtype=float)
        highest = max(float(np.nanmax(tops)) if np.isfinite(tops).any() else 0.0, 1.0)
        axes.set_ylim(0, highest * 1.12)
        axes.set_title(title)
        axes.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        axes.text(
            1.0,
            -0.2,
            "bars: Δ with its simultaneous interval; * flagged (Holm-adjusted p < α)",
            transform=axes.transAxes,
            ha="right",
            fontsize="x-small",
            color="0.35",
        )
        return _save(figure, path)


def skin_tone_shift(frame: pd.DataFrame, dimension: str, title: str, path: Path) -> Path:
    """Distribution of the skin's ITA shift (degrees; positive = lighter) per group.

    One box per group of ``dimension`` over the requests that were not refused and have a
    measured shift (column ``ita_shift``), with the group's mean as a white dot. A group whose
    box sits above 0 had its skin lightened by the editor.
    """
    sns = plotting()
    usable = frame.loc[frame["hard_refusal"].eq(False) & frame["ita_shift"].notna()]
    if usable.empty:
        raise ValueError("no measured skin-tone shifts to plot")
    order = [g for g in _ordered_categories(usable[dimension])]
    data = usable.assign(ita_shift=usable["ita_shift"].astype(float))
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((1.4 + 0.9 * len(order), 3.4))
        axes = figure.add_subplot()
        sns.boxplot(data=data, x=dimension, y="ita_shift", order=order, ax=axes,
                    color=sns.color_palette("colorblind")[0], fliersize=1.5, linewidth=0.8,
                    showmeans=True,
                    meanprops={"marker": "o", "markerfacecolor": "white",
                               "markeredgecolor": "black", "markersize": 4})
        axes.axhline(0, color="0.3", linewidth=0.8)
        axes.set_xlabel(dimension)
        axes.set_ylabel("ITA shift (°, + = lighter)")
        axes.set_title(title)
        return _save(figure, path)


def model_comparison(gaps: pd.DataFrame, outcome: str, dimension: str, title: str,
                     path: Path) -> Path:
    """Δ per prompt category for every model side by side, with intervals.

    ``gaps`` holds the disparity rows of several models (a ``model`` column added); flagged
    gaps carry a star.
    """
    sns = plotting()
    block = gaps.loc[(gaps["outcome"] == outcome) & (gaps["dimension"] == dimension)]
    if block.empty:
        raise ValueError(f"no disparities for outcome '{outcome}' and dimension '{dimension}'")
    categories = _ordered_categories(block["category"])
    models = _ordered_categories(block["model"])
    width = 0.8 / len(models)
    palette = sns.color_palette("colorblind", len(models))
    x = np.arange(len(categories))
    indexed = block.set_index(["model", "category"])
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((1.6 + 1.1 * len(categories), 3.4))
        axes = figure.add_subplot()
        for m, model in enumerate(models):
            present = indexed.reindex([(model, c) for c in categories])
            delta = 100 * present["delta"].to_numpy(dtype=float)
            low = 100 * present["ci_low"].to_numpy(dtype=float)
            high = 100 * present["ci_high"].to_numpy(dtype=float)
            errors = np.vstack([np.clip(delta - low, 0, None), np.clip(high - delta, 0, None)])
            offset = x - 0.4 + width * (m + 0.5)
            axes.bar(offset, np.nan_to_num(delta), width * 0.92, yerr=np.nan_to_num(errors),
                     color=palette[m], label=model, capsize=2,
                     error_kw={"elinewidth": 0.9, "ecolor": "0.25"})
            flagged = present["flagged"].fillna(False).to_numpy(dtype=bool)
            for xi, top, flag in zip(offset, high, flagged, strict=True):
                if flag:
                    axes.annotate("*", (xi, np.nan_to_num(top)), ha="center", va="bottom",
                                  fontsize=12, fontweight="bold")
        axes.set_xticks(x, categories)
        axes.set_xlabel("prompt category")
        axes.set_ylabel(f"Δ by {dimension} (pp)")
        axes.set_ylim(bottom=0)
        axes.set_title(title)
        axes.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        return _save(figure, path)


def scs_points(scs: pd.DataFrame, title: str, path: Path) -> Path:
    """Stereotype congruence score per model and category, with its interval.

    ``scs`` has columns ``model, category, estimate, ci_low, ci_high, defined``; undefined
    scores (zero baseline) are listed in the axis label instead of drawn.
    """
    sns = plotting()
    defined = scs.loc[scs["defined"].astype(bool)]
    labels = [f"{m} · {c}" for m, c in zip(scs["model"], scs["category"], strict=True)]
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((5.5, 0.6 + 0.45 * max(len(scs), 1)))
        axes = figure.add_subplot()
        y = np.arange(len(scs))
        mask = scs["defined"].astype(bool).to_numpy()
        estimate = scs["estimate"].to_numpy(dtype=float)
        low = scs["ci_low"].to_numpy(dtype=float)
        high = scs["ci_high"].to_numpy(dtype=float)
        axes.errorbar(estimate[mask], y[mask],
                      xerr=np.vstack([estimate[mask] - low[mask], high[mask] - estimate[mask]]),
                      fmt="o", color="black", capsize=3, markersize=4)
        axes.axvline(0, color="0.3", linewidth=0.8)
        axes.set_yticks(y, [label if ok else f"{label} (undefined)"
                            for label, ok in zip(labels, mask, strict=True)])
        axes.invert_yaxis()
        axes.set_xlabel("SCS = (R incongruent − R congruent) / R baseline")
        axes.set_title(title)
        if defined.empty:
            axes.set_xlim(-1, 1)
        return _save(figure, path)


def attribute_rate_points(rates: pd.DataFrame, planted: pd.DataFrame | None, outcome: str,
                          title: str, path: Path) -> Path:
    """Rate of ``outcome`` per prompt attribute (text-to-image), one row per attribute with its
    interval, coloured by attribute dimension, the neutral baseline as a dashed line; with
    ``planted`` (planted vs measured rows), each attribute's planted rate as a cross."""
    sns = plotting()
    block = rates.loc[rates["outcome"] == outcome].reset_index(drop=True)
    if block.empty:
        raise ValueError(f"no rates for outcome '{outcome}'")
    dimensions = _ordered_categories(block["dimension"])
    palette = dict(zip(dimensions, sns.color_palette("colorblind", len(dimensions)), strict=True))
    y = np.arange(len(block))[::-1]
    rate = 100 * block["rate"].to_numpy(dtype=float)
    low = 100 * block["ci_low"].to_numpy(dtype=float)
    high = 100 * block["ci_high"].to_numpy(dtype=float)
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((6.4, 1.2 + 0.22 * len(block)))
        axes = figure.add_subplot()
        for dimension in dimensions:
            rows = (block["dimension"] == dimension).to_numpy()
            axes.errorbar(rate[rows], y[rows],
                          xerr=np.nan_to_num(np.vstack([rate[rows] - low[rows],
                                                        high[rows] - rate[rows]])),
                          fmt="o", color=palette[dimension], label=dimension, capsize=2,
                          markersize=4, elinewidth=0.9)
        neutral = block.loc[block["dimension"] == "neutral", "rate"]
        if len(neutral):
            axes.axvline(100 * float(neutral.iloc[0]), color="0.4", linestyle="--", linewidth=0.8)
        if planted is not None:
            truth = planted.loc[(planted["outcome"] == outcome) & (planted["value"] != "Δ")]
            mapping = dict(zip(truth["value"], 100 * truth["planted"].astype(float), strict=True))
            marks = np.array([mapping.get(a, np.nan) for a in block["attribute"]], dtype=float)
            axes.scatter(marks, y, marker="x", color="black", s=18, zorder=3, label="planted")
        axes.set_yticks(y, list(block["attribute"]))
        axes.set_xlabel(f"{outcome.replace('_', ' ')} rate (%)")
        axes.set_xlim(left=0)
        axes.set_title(title)
        axes.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        return _save(figure, path)
