"""The rounds of a sequential audit (params ``plan.sequential``, docs/sequential.md): which
sources (or base prompts) each round adds, and how far a model's audit has gone.

For an image editor, round r adds ``sources_per_round`` sources of every race, each with all
its planned requests, so every round is balanced across races and the source stays the unit
of independence (the confidence sequences of :mod:`acrb.analysis.estimation.sequential` take
one cluster mean per race and round). The sources of each race join in an order drawn once
from ``plan.sequential.seed``; a race's sources past the last full round are never run.

For a text-to-image model, round r adds ``prompts_per_round`` base prompts, each with the
variant of every attribute (and its neutral form), so every round is balanced across the
attributes and the base prompt stays the unit of independence, as the T2I analysis clusters
on it. The base prompts join in an order drawn from the same seed; those past the last full
round are never run.

How far a model has gone is its *progress file*, ``data/generations/<model>/sequential.json``
(inside the generate stage's output, so every later stage that reads the generations reads
it): the rounds whose requests are included, and, once each round is measured, its
observations and the stopping decision. Every stage sees the same requests through
:func:`included_requests` (:meth:`acrb.stages.context.StageContext.model_requests`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from acrb import layout
from acrb.demographics import RACES
from acrb.errors import InputDataError

if TYPE_CHECKING:
    from acrb.config import SequentialParams

#: The progress file's name inside an editor's generations folder.
PROGRESS_FILE = "sequential.json"
PROGRESS_VERSION = 1


def progress_path(model: str) -> Path:
    return layout.generations_dir(model) / PROGRESS_FILE


def source_rounds(requests: pd.DataFrame, params: SequentialParams) -> pd.Series:
    """Round (1-based) of every source of ``requests`` (plan rows with ``source_id``, ``race``,
    ``gender`` and ``age``), indexed by source id; 0 for a source past its race's last full
    round.

    Every race's sources are ordered the same way: the gender x age cells in an order drawn
    from ``params.seed``, one source of each cell in turn (within a cell in a drawn order), so
    that in a balanced design (the same cells in every race) each round adds sources of the
    same cells for every race and the strata stay balanced as the audit grows. The order
    depends on the ids alone, never on the plan's row order."""
    sources = (requests[["source_id", "race", "gender", "age"]].drop_duplicates("source_id")
               .sort_values("source_id", kind="stable").reset_index(drop=True))
    races = [race for race in RACES if race in set(sources["race"])]
    races += sorted(set(sources["race"]) - set(races))
    per_round = params.sources_per_round
    smallest = min(int((sources["race"] == race).sum()) for race in races)
    full = smallest // per_round
    if full < 1:
        raise InputDataError(
            f"plan.sequential.sources_per_round is {per_round}, more than the sources of the "
            f"smallest race ({smallest})",
            "lower plan.sequential.sources_per_round, or add sources")
    rng = np.random.default_rng(params.seed)
    cells = sorted(set(zip(sources["gender"], sources["age"], strict=True)))
    cell_rank = {cells[index]: position
                 for position, index in enumerate(rng.permutation(len(cells)))}
    sources["cell"] = [cell_rank[(g, a)] for g, a in zip(sources["gender"], sources["age"],
                                                          strict=True)]
    sources["draw"] = rng.permutation(len(sources))
    rounds: dict[str, int] = {}
    for race in races:
        own = sources[sources["race"] == race].sort_values(["cell", "draw"])
        # The j-th source of each cell, cells in the drawn order: every cell once, then again.
        own = own.assign(turn=own.groupby("cell").cumcount()).sort_values(["turn", "cell"])
        for position, source in enumerate(own["source_id"]):
            number = position // per_round + 1
            rounds[str(source)] = number if number <= full else 0
    return pd.Series(rounds, name="round", dtype=int)


def unit_column(requests: pd.DataFrame) -> str:
    """The plan column naming the unit a round adds: ``source_id`` for an image editor's
    requests, ``base_id`` for a text-to-image model's."""
    return "source_id" if (requests["mode"] == "i2i").any() else "base_id"


def prompt_rounds(requests: pd.DataFrame, params: SequentialParams) -> pd.Series:
    """Round (1-based) of every base prompt of a text-to-image model's ``requests`` (plan rows
    with ``base_id``), indexed by base id; 0 for a base prompt past the last full round.

    The base prompts join ``params.prompts_per_round`` at a time in an order drawn from
    ``params.seed`` over their sorted ids, so the order depends on the ids alone, never on the
    plan's row order; each brings every one of its variants (one per attribute)."""
    bases = sorted(set(requests["base_id"].astype(str)))
    per_round = params.prompts_per_round
    full = len(bases) // per_round
    if full < 1:
        raise InputDataError(
            f"plan.sequential.prompts_per_round is {per_round}, more than the text-to-image "
            f"base prompts ({len(bases)})",
            "lower plan.sequential.prompts_per_round, or add base prompts")
    order = np.random.default_rng(params.seed).permutation(len(bases))
    rounds = {bases[index]: (position // per_round + 1
                             if position // per_round + 1 <= full else 0)
              for position, index in enumerate(order)}
    return pd.Series(rounds, name="round", dtype=int)


def unit_rounds(requests: pd.DataFrame, params: SequentialParams) -> pd.Series:
    """Round of every unit of ``requests`` (one model's plan rows): its sources'
    (:func:`source_rounds`) for an image editor, its base prompts' (:func:`prompt_rounds`)
    for a text-to-image model."""
    if unit_column(requests) == "source_id":
        return source_rounds(requests, params)
    return prompt_rounds(requests, params)


def read_progress(root: Path, model: str) -> dict[str, Any] | None:
    """``model``'s progress file, or None before its first round."""
    path = root / progress_path(model)
    if not path.is_file():
        return None
    try:
        progress = json.loads(path.read_text(encoding="utf-8"))
        if progress["version"] != PROGRESS_VERSION:
            raise ValueError(f"version {progress['version']!r}, this ACRB reads "
                             f"{PROGRESS_VERSION}")
        int(progress["included_rounds"])
        dict(progress["declaration"]["rounds"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputDataError(
            f"{path} is not a sequential audit's progress file: {exc}",
            f"restore it (`dvc checkout`), or delete data/generations/{model} to restart "
            "that editor's audit") from exc
    return dict(progress)


def included_requests(requests: pd.DataFrame, root: Path, model: str) -> pd.DataFrame:
    """The rows of ``model``'s planned ``requests`` that its sequential audit has included so
    far, by the rounds its progress file recorded for each source (or base prompt) when the
    audit began; none before the first round."""
    progress = read_progress(root, model)
    if progress is None:
        return requests.iloc[0:0].reset_index(drop=True)
    recorded = pd.Series(progress["declaration"]["rounds"], dtype=int)
    keep = requests[unit_column(requests)].astype(str).map(recorded) \
        .between(1, int(progress["included_rounds"]))
    return requests[keep.to_numpy()].reset_index(drop=True)


def flat_metrics(progress: dict[str, Any]) -> dict[str, float]:
    """A finished audit's stop and spending as flat metrics (MLflow, ``metrics/audit``): the
    stop round and whether it came before the sources ran out, the requests, dollars and GPU
    hours spent and the whole design's, the share of the design's requests saved, and each
    Δ's final interval and the round it was decided (0: never)."""
    spent, design = progress["spent"], progress["design"]
    stop = progress["stop"]
    metrics: dict[str, float] = {
        "sequential.stop_round": stop["round"],
        "sequential.rounds_available": progress["available_rounds"],
        "sequential.stopped_early": float(stop["reason"] == "decided"
                                          and stop["round"] < progress["available_rounds"]),
        **{f"sequential.spent.{k}": v for k, v in spent.items()},
        **{f"sequential.design.{k}": v for k, v in design.items()},
        "sequential.saved_fraction": 1 - spent["requests"] / design["requests"],
    }
    for name, delta in progress["deltas"].items():
        if delta.get("lower") and delta["lower"][-1] is not None:
            metrics[f"sequential.{name}.lower"] = delta["lower"][-1]
            metrics[f"sequential.{name}.upper"] = delta["upper"][-1]
            metrics[f"sequential.{name}.decided_round"] = delta["decided_round"]
    return metrics


def summary(root: Path, model: str) -> dict[str, Any] | None:
    """What the report and metrics say of ``model``'s sequential audit: when it stopped and
    why, what it spent against the whole design, and each Δ's final interval and decision;
    None when the editor was not audited in rounds (or has not finished)."""
    progress = read_progress(root, model)
    if progress is None or not progress["finished"]:
        return None
    declaration = progress["declaration"]
    return {
        "model": model,
        "stop_round": progress["stop"]["round"],
        "reason": progress["stop"]["reason"],
        "rounds_available": progress["available_rounds"],
        "budget_rounds": progress["budget_rounds"],
        "budget_limit": progress["budget_limit"],
        "sources_per_round": declaration["params"]["sources_per_round"],
        "prompts_per_round": declaration["params"].get("prompts_per_round"),
        "alpha": declaration["params"]["alpha"],
        "margin": declaration["params"]["margin"],
        "spent": progress["spent"],
        "design": progress["design"],
        "saved_fraction": 1 - progress["spent"]["requests"] / progress["design"]["requests"],
        "deltas": [
            {"name": name, "claim": declaration["hypotheses"][name]["claim"],
             "outcome": declaration["hypotheses"][name]["outcome"],
             "category": declaration["hypotheses"][name]["category"],
             "lower": delta["lower"][-1] if delta.get("lower") else None,
             "upper": delta["upper"][-1] if delta.get("upper") else None,
             "decision": delta.get("decision", "undecided"),
             "decided_round": delta.get("decided_round", 0),
             "rounds_counted": sum(o is not None for o in delta["observations"])}
            for name, delta in progress["deltas"].items()],
        "metrics": flat_metrics(progress),
    }
