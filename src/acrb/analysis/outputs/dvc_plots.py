"""The PNG plots ``dvc plots show`` and ``dvc plots diff`` display: one question per image.

DVC renders a CSV plot with vega, whose JavaScript its HTML page loads from a CDN, so offline
such plots do not appear. Image plots are embedded as files and need no script, so the plots
the project declares in ``dvc.yaml`` are PNGs drawn here from the same tables as
``plots/delta.csv`` and ``plots/rates.csv``:

- ``plots/delta/<outcome>.png``: Δ (max − min group rate, in percentage points) with its
  interval for every cell (prompt category / dimension) and model, flagged cells marked;
- ``plots/rates/<outcome>.png``: the outcome's rate per group (dimension: value) with its
  interval for every model, pooled over prompt categories (a text-to-image model's rows are
  its prompt attributes).

Each image is named by the outcome alone, so ``dvc plots diff`` sets the same question of two
revisions side by side.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from acrb.analysis.outcomes import OUTCOMES, outcome_phrase
from acrb.analysis.outputs.figures import (
    _CONTEXT,
    _STYLE,
    _ordered_categories,
    _save,
    new_figure,
    plotting,
)

DELTA_DIR = Path("delta")
RATES_DIR = Path("rates")


def _outcome_order(values: pd.Series) -> list[str]:
    present = set(values.astype(str))
    return [o for o in OUTCOMES if o in present] + sorted(present - set(OUTCOMES))


def _interval_points(axes, frame: pd.DataFrame, value: str, labels: list[str], label_column: str,
                     models: list[str]) -> None:
    """Points with horizontal interval bars: one row per label, models offset within it."""
    palette = plotting().color_palette("colorblind", len(models))
    y = np.arange(len(labels))[::-1]
    step = 0.7 / max(len(models), 1)
    for m, model in enumerate(models):
        block = frame[frame["model"] == model].drop_duplicates(label_column).set_index(label_column)
        present = block.reindex(labels)
        centre = 100 * present[value].to_numpy(dtype=float)
        low = 100 * present["ci_low"].to_numpy(dtype=float)
        high = 100 * present["ci_high"].to_numpy(dtype=float)
        offset = y + 0.35 - step * (m + 0.5)
        errors = np.nan_to_num(np.vstack([np.clip(centre - low, 0, None),
                                          np.clip(high - centre, 0, None)]))
        axes.errorbar(centre, offset, xerr=errors, fmt="o", color=palette[m], label=model,
                      capsize=2, markersize=4, elinewidth=0.9)
        if "flagged" in present:
            flagged = present["flagged"].fillna(False).to_numpy(dtype=bool)
            axes.scatter(centre[flagged], offset[flagged], marker="*", s=90, color=palette[m],
                         edgecolors="black", linewidths=0.6, zorder=3)
    axes.set_yticks(y, labels)
    axes.set_ylim(-0.6, len(labels) - 0.4)


def delta_plot(deltas: pd.DataFrame, outcome: str, path: Path) -> Path:
    """Δ of ``outcome`` with its interval per cell and model (rows of ``plots/delta.csv``:
    ``model``, ``outcome``, ``cell``, ``delta``, ``ci_low``, ``ci_high``, ``flagged``); a star
    marks a flagged cell."""
    block = deltas[deltas["outcome"] == outcome]
    if block.empty:
        raise ValueError(f"no disparities for outcome '{outcome}'")
    cells = _ordered_categories(block["cell"])
    models = _ordered_categories(block["model"])
    sns = plotting()
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((7.0, 1.3 + 0.28 * len(cells) * max(1, len(models)) ** 0.5))
        axes = figure.add_subplot()
        _interval_points(axes, block, "delta", cells, "cell", models)
        axes.set_xlim(left=0)
        axes.set_xlabel("Δ, max − min group rate (pp); ★ flagged after Holm correction")
        axes.set_ylabel("cell (prompt category / dimension)")
        axes.set_title(f"Δ {outcome_phrase(outcome)} per cell and model")
        axes.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        return _save(figure, path)


def rates_plot(rates: pd.DataFrame, outcome: str, path: Path) -> Path:
    """Rate of ``outcome`` per group with its interval for every model, pooled over prompt
    categories (rows of ``plots/rates.csv`` with ``category`` ``all``: ``model``, ``group``,
    ``rate``, ``ci_low``, ``ci_high``)."""
    block = rates[(rates["outcome"] == outcome) & (rates["category"] == "all")]
    if block.empty:
        raise ValueError(f"no pooled rates for outcome '{outcome}'")
    groups = _ordered_categories(block["group"])
    models = _ordered_categories(block["model"])
    sns = plotting()
    with sns.axes_style(_STYLE), sns.plotting_context(_CONTEXT, font_scale=0.8):
        figure = new_figure((7.0, 1.3 + 0.24 * len(groups) * max(1, len(models)) ** 0.5))
        axes = figure.add_subplot()
        _interval_points(axes, block, "rate", groups, "group", models)
        axes.set_xlim(left=0)
        axes.set_xlabel(f"{outcome_phrase(outcome)} rate (%)")
        axes.set_ylabel("group (dimension: value)")
        axes.set_title(f"{outcome_phrase(outcome).capitalize()} rate per group and model")
        axes.legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        return _save(figure, path)


def dvc_plot_jobs(deltas: pd.DataFrame, rates: pd.DataFrame,
                  folder: Path) -> list[Callable[[], Path]]:
    """The plots :func:`write_dvc_plots` draws, in its order, each as a call that draws it
    and returns its path (a picklable :func:`functools.partial`, so that a pool of processes
    can draw them)."""
    jobs: list[Callable[[], Path]] = [
        functools.partial(delta_plot, deltas, outcome, folder / DELTA_DIR / f"{outcome}.png")
        for outcome in _outcome_order(deltas["outcome"])]
    pooled = rates[rates["category"] == "all"]
    jobs += [functools.partial(rates_plot, rates, outcome, folder / RATES_DIR / f"{outcome}.png")
             for outcome in _outcome_order(pooled["outcome"])]
    return jobs


def remove_stale_plots(folder: Path, written: list[Path]) -> None:
    """Remove the PNGs under ``folder``'s plot folders that are not in ``written`` (those of
    outcomes no longer present)."""
    for sub in (DELTA_DIR, RATES_DIR):
        for stale in (folder / sub).glob("*.png") if (folder / sub).exists() else []:
            if stale not in written:
                stale.unlink()


def write_dvc_plots(deltas: pd.DataFrame, rates: pd.DataFrame, folder: Path) -> list[Path]:
    """Every outcome's Δ and rate plots under ``folder`` (``delta/<outcome>.png``,
    ``rates/<outcome>.png``); PNGs of outcomes no longer present are removed."""
    written = [draw() for draw in dvc_plot_jobs(deltas, rates, folder)]
    remove_stale_plots(folder, written)
    return written
