"""One text-to-image model's section of the analysis: the statistics of
:mod:`acrb.analysis.experiments.attributes` (refusal by prompt attribute, clustered on the base
prompt), the rate figure, and the files :func:`read_any_section` reads back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.estimation.resampling import GroupTest
from acrb.analysis.experiments.attributes import (
    T2I_OUTCOMES,
    TASK,
    attribute_disparities,
    attribute_equivalence,
    attribute_planted_vs_measured,
    attribute_rates,
)
from acrb.analysis.outputs.figures import attribute_rate_points
from acrb.analysis.outputs.section import STATUSES, FigureRef, ModelSection, read_section
from acrb.errors import InputDataError
from acrb.storage import atomic_write_json, write_parquet


@dataclass(frozen=True)
class AttributeSection:
    """Everything the report shows about one text-to-image model (see the module docstring);
    ``planted`` is None for a real model; ``equivalence`` is None in a section written before
    the equivalence test existed."""

    slug: str
    key: str
    simulated: bool
    status_counts: Mapping[str, int]
    rates: pd.DataFrame
    disparities: pd.DataFrame
    planted: pd.DataFrame | None = None
    equivalence: pd.DataFrame | None = None
    figures: Sequence[FigureRef] = field(default_factory=tuple)
    task: str = TASK


def build_attribute_section(frame: pd.DataFrame, slug: str, key: str, simulated: bool,
                            figure_dir: Path, confidence: float = 0.95, alpha: float = 0.05, *,
                            simultaneous: bool = False, test: GroupTest = "between-groups",
                            bootstrap: int = defaults.BOOTSTRAP_RESAMPLES,
                            permutations: int = defaults.PERMUTATIONS,
                            seed: int = defaults.SEED,
                            margin: float = defaults.EQUIVALENCE_MARGIN) -> AttributeSection:
    """Rates by attribute, Δ per attribute family (per-row intervals, or simultaneous ones with
    ``simultaneous``; row test ``test``: :func:`attribute_disparities`), the equivalence test of
    Δ < ``margin`` per family (:func:`attribute_equivalence` at ``alpha``), planted vs measured
    (when the frame has ``planted_refusal``) and the rate figure
    (``{slug}-t2i-hard_refusal-attribute.png``)."""
    rates = pd.concat([attribute_rates(frame, o, confidence, bootstrap, seed)
                       for o in T2I_OUTCOMES], ignore_index=True)
    gaps = pd.concat([attribute_disparities(frame, o, confidence, alpha, bootstrap,
                                            permutations, seed, simultaneous, test=test)
                      for o in T2I_OUTCOMES], ignore_index=True)
    equivalence = pd.concat([attribute_equivalence(frame, o, margin, alpha)
                             for o in T2I_OUTCOMES], ignore_index=True)
    planted = None
    if "planted_refusal" in frame.columns:
        planted = attribute_planted_vs_measured(frame, rates, gaps)
    counts = frame["status"].astype(str).value_counts()
    status_counts = {s: int(counts.get(s, 0)) for s in STATUSES}
    status_counts.update({str(s): int(c) for s, c in counts.items() if s not in status_counts})
    path = attribute_rate_points(
        rates, planted, "hard_refusal", f"{slug}: refusal rate by prompt attribute",
        figure_dir / f"{slug}-t2i-hard_refusal-attribute.png")
    figures = (FigureRef("hard_refusal", "Refusal rate by prompt attribute (interval clustered "
                         "on base prompt" + ("; × planted" if planted is not None else "") + ")",
                         path),)
    return AttributeSection(slug=slug, key=key, simulated=simulated, status_counts=status_counts,
                            rates=rates, disparities=gaps, planted=planted,
                            equivalence=equivalence, figures=figures)


def write_attribute_section(section: AttributeSection, folder: Path, root: Path) -> None:
    """Write a T2I section as :func:`read_any_section` reads it back (Parquet tables and a
    ``section.json`` whose ``task`` is ``t2i``)."""
    write_parquet(section.rates, folder / "rates.parquet")
    write_parquet(section.disparities, folder / "disparities.parquet")
    if section.planted is not None:
        write_parquet(section.planted, folder / "planted_vs_measured.parquet")
    if section.equivalence is not None:
        write_parquet(section.equivalence, folder / "equivalence.parquet")
    atomic_write_json(folder / "section.json", {
        "task": TASK, "slug": section.slug, "key": section.key, "simulated": section.simulated,
        "status_counts": dict(section.status_counts),
        "figures": [{"outcome": f.outcome, "caption": f.caption,
                     "path": str(Path(f.path).resolve().relative_to(root))}
                    for f in section.figures],
    })


def read_any_section(folder: Path, root: Path) -> ModelSection | AttributeSection:
    """The section in ``folder``: a T2I :class:`AttributeSection` when its ``section.json``
    says ``task: t2i``, else an I2I :class:`~acrb.analysis.outputs.section.ModelSection`."""
    index_path = folder / "section.json"
    if not index_path.exists():
        raise InputDataError(f"{index_path} not found", "run `acrb analyze` (or `dvc repro`)")
    index = json.loads(index_path.read_text())
    if index.get("task") != TASK:
        return read_section(folder, root)
    planted_path = folder / "planted_vs_measured.parquet"
    equivalence_path = folder / "equivalence.parquet"
    return AttributeSection(
        slug=index["slug"], key=index["key"], simulated=index["simulated"],
        status_counts=index["status_counts"],
        rates=pd.read_parquet(folder / "rates.parquet"),
        disparities=pd.read_parquet(folder / "disparities.parquet"),
        planted=pd.read_parquet(planted_path) if planted_path.exists() else None,
        equivalence=(pd.read_parquet(equivalence_path) if equivalence_path.exists()
                     else None),
        figures=tuple(FigureRef(f["outcome"], f["caption"], root / f["path"])
                      for f in index["figures"]),
    )

