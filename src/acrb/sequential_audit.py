"""A sequential audit's round loop (params ``plan.sequential``; docs/sequential.md).

The ``generate`` stage of a model runs it when ``plan.sequential`` is set. It
interleaves the work of stages, generation, the detectors and, when a declared Δ is of a judge
outcome, the judges, round by round, which DVC's stages (run one after another, each once)
cannot express; so it lives outside :mod:`acrb.stages`, and the ``generate`` stage declares
the detectors' and the judges' code among its DVC dependencies. Their settings (and the
hypotheses') reach it through the plan: the ``plan`` stage records them as the stopping rule,
``data/plan/stopping.json`` (null for a fixed design, so a detector or judge threshold does
not re-run a fixed design's generation), and the loop refuses a stale one
(:func:`check_stopping_rule`). Each round:

1. the progress file (:mod:`acrb.rounds`) includes one more round of sources (of base
   prompts, for a text-to-image model), so the model's requests
   (:meth:`~acrb.stages.context.StageContext.model_requests`) are those of the rounds so far;
2. the new requests are generated (:func:`acrb.stages.generate.run_requests`: finished ones
   are skipped, so a killed audit resumes inside its round) and read by the detectors
   (:func:`acrb.stages.evaluate.run`, whose stored judgements are reused the same way) and,
   when a Δ is of a judge outcome (``soft_erasure``, ``race_drift``...), scored by the judges
   (:func:`acrb.stages.judge.run`, which asks only about outputs it has not scored: the
   ``judge`` stage after the audit reuses every score);
3. for every declared Δ the round's cluster mean of its outcome per group is added, and its
   anytime-valid confidence sequence (:mod:`acrb.analysis.estimation.sequential`) updated.
   An editor's Δs are ``plan.sequential.hypotheses`` (disparity and equivalence hypotheses
   across races, of a detector or a judge outcome); a text-to-image model's are the refusal
   Δ across the attributes of each dimension of ``plan.sequential.t2i_dimensions`` (its
   base prompt's variants in the round);
4. the round's spending and every Δ's interval are logged to MLflow at step = round, and the
   progress file is rewritten with the round's observations;
5. the audit stops when every Δ is decided (its interval excludes 0: a gap; or lies inside
   ``[-margin, margin]``: no gap) or the budget (rounds, requests, dollars, GPU hours) is
   spent.

The intervals are a function of the observations alone, so a rerun, or a resumed kill,
reaches the same round and decisions; a finished audit's rerun includes no new round. The
later stages (``evaluate``, ``judge``, ``analyze``...) see only the rounds run; ``analyze``
reports where the audit stopped, why, and what it spent against the whole design
(:func:`summary`).

A Δ's round counts only when each of its races has an observed outcome in the round (a
conditional outcome such as erasure is unobserved on refused requests): its sequence is over
its complete rounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from acrb import layout
from acrb.analysis.estimation.sequential import (
    DeclaredDelta,
    Method,
    decide,
    delta_bounds,
    first_decided_round,
    pair_level,
    upper_level,
)
from acrb.analysis.outcomes import JUDGE_OUTCOMES
from acrb.config import HypothesisSpec, SequentialParams
from acrb.demographics import RACES
from acrb.errors import InputDataError
from acrb.records import JudgementRecord, RequestRecord, VerdictRecord, read_table
from acrb.rounds import (
    PROGRESS_VERSION,
    flat_metrics,
    progress_path,
    read_progress,
    unit_column,
    unit_rounds,
)
from acrb.stages import evaluate, generate, judge
from acrb.stages.context import StageContext
from acrb.storage import atomic_write_text, content_hash
from acrb.tracking import RunLog, stage_run


@dataclass(frozen=True)
class RoundDesign:
    """What one model's sequential audit may run: each unit's round (a source, or a base
    prompt), the requests of each round, the rounds the budget allows and the whole design's
    requests."""

    rounds: pd.Series
    requests_per_round: tuple[int, ...]
    budget_rounds: int
    budget_reason: str
    design_requests: int


@dataclass(frozen=True)
class Target:
    """What a declared Δ measures: its ``outcome`` (a column of the judgements table) over the
    requests of ``category`` (None: all), grouped by the plan column ``group_column`` (``race``
    for an editor, ``attribute`` for a text-to-image model), and how the progress file
    declares it (``declared``: the hypothesis' spec, or the T2I dimension's)."""

    outcome: str
    category: str | None
    group_column: str
    declared: dict[str, Any]


def runs_in_rounds(ctx: StageContext, model: str) -> bool:
    """Whether ``model`` is audited in rounds: ``plan.sequential`` is set (every model then is,
    an editor in rounds of sources, a text-to-image model in rounds of base prompts)."""
    return ctx.params.plan.sequential is not None


def _planned(ctx: StageContext, model: str) -> pd.DataFrame:
    """Every planned request of ``model``, whatever its audit has included."""
    plan = read_table(ctx.path(layout.PLAN_TABLE), RequestRecord, validate=False)
    return plan[plan["model"] == model].reset_index(drop=True)


def _audited(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests the declared Δs are measured on: the audit's own plain-arm edits (or
    text-to-image prompts)."""
    return requests[requests["mode"].isin(["i2i", "t2i"]) & (requests["arm"] == "none")
                    & (requests["experiment"] == "audit")]


def round_design(ctx: StageContext, model: str) -> RoundDesign:
    params = _params(ctx)
    planned = _planned(ctx, model)
    rounds = unit_rounds(planned, params)
    numbers = planned[unit_column(planned)].astype(str).map(rounds)
    available = int(rounds.max())
    per_round = tuple(int((numbers == r).sum()) for r in range(1, available + 1))
    cumulative = np.cumsum(per_round)
    limits = {"the sources": available}
    if params.max_rounds is not None:
        limits["max_rounds"] = min(params.max_rounds, available)
    for name, cap, unit in (("max_requests", params.max_requests, 1.0),
                            ("max_dollars", params.max_dollars, params.dollars_per_request),
                            ("max_gpu_hours", params.max_gpu_hours,
                             params.gpu_seconds_per_request / 3600)):
        if cap is not None and unit > 0:
            limits[name] = int(np.searchsorted(cumulative * unit, cap, side="right"))
    reason = min(limits, key=lambda k: limits[k])
    if limits[reason] < 1:
        raise _budget_error(model, reason, per_round[0], params,
                            unit_column(planned) == "source_id")
    return RoundDesign(rounds=rounds, requests_per_round=per_round,
                       budget_rounds=limits[reason], budget_reason=reason,
                       design_requests=len(planned))


def _budget_error(model: str, reason: str, first: int, params: SequentialParams,
                  editor: bool) -> Exception:
    from acrb.errors import ConfigError

    unit = (f"{params.sources_per_round} source(s) of each race" if editor
            else f"{params.prompts_per_round} base prompt(s) with all their attributes")
    return ConfigError(f"plan.sequential.{reason} does not cover the first round of model "
                       f"'{model}' ({first} requests, {unit})", f"raise plan.sequential.{reason}")


def _params(ctx: StageContext) -> SequentialParams:
    params = ctx.params.plan.sequential
    assert params is not None, "called for a sequential audit only"
    return params


def hypothesis_target(spec: HypothesisSpec) -> Target:
    """What an editor's declared hypothesis measures, as a :class:`Target` across races."""
    return Target(outcome=spec.outcome, category=spec.category, group_column="race",
                  declared=spec.model_dump(mode="json"))


def declared_deltas(ctx: StageContext, model: str) -> dict[str, tuple[DeclaredDelta, Target]]:
    """Each Δ that decides ``model``'s stop -> the Δ (range: max - min rate over its groups,
    with the margin ``plan.sequential.margin``) and what it measures. For an editor, each
    hypothesis of :meth:`~acrb.config.Params.sequential_hypotheses` across the races of its
    sources; for a text-to-image model, the refusal Δ across the attributes of each dimension
    (:func:`t2i_deltas`)."""
    params = _params(ctx)
    planned = _planned(ctx, model)
    if unit_column(planned) == "base_id":
        return t2i_deltas(planned, params, model)
    present = set(planned["race"])
    races = tuple(r for r in RACES if r in present) + tuple(sorted(present - set(RACES)))
    return {name: (DeclaredDelta(name=name, groups=races, margin=params.margin, kind="range"),
                   hypothesis_target(spec))
            for name, spec in ctx.params.sequential_hypotheses().items()}


def t2i_deltas(planned: pd.DataFrame, params: SequentialParams, model: str
               ) -> dict[str, tuple[DeclaredDelta, Target]]:
    """A text-to-image model's declared Δs: for each dimension of
    ``params.t2i_dimensions`` (null: every dimension of two or more attributes its prompts
    carry), the hard-refusal Δ (max - min rate) across that dimension's attributes
    (``dimension:value``), named ``refusal_<dimension>``; every base prompt of a round
    brings one request of each attribute. ConfigError naming a dimension the prompts lack."""
    from acrb.errors import ConfigError

    dimensions: dict[str, list[str]] = {}
    for attribute in sorted(set(_audited(planned)["attribute"].astype(str))):
        if ":" in attribute:
            dimensions.setdefault(attribute.split(":", 1)[0], []).append(attribute)
    dimensions = {d: values for d, values in dimensions.items() if len(values) >= 2}
    chosen = params.t2i_dimensions if params.t2i_dimensions is not None else sorted(dimensions)
    unknown = [d for d in chosen if d not in dimensions]
    if unknown or not chosen:
        raise ConfigError(
            f"plan.sequential.t2i_dimensions names {unknown or 'no dimension'}, which the "
            f"prompts of model '{model}' do not carry with two or more attributes",
            f"name some of: {', '.join(sorted(dimensions)) or 'none'}")
    if len(set(chosen)) != len(chosen):
        raise ConfigError("plan.sequential.t2i_dimensions names a dimension twice",
                          "name each dimension once")
    return {f"refusal_{d}": (
        DeclaredDelta(name=f"refusal_{d}", groups=tuple(dimensions[d]), margin=params.margin,
                      kind="range"),
        Target(outcome="hard_refusal", category=None, group_column="attribute",
               declared={"claim": f"Text-to-image refusals differ across the {d} attributes "
                                  "of the prompts",
                         "test": "disparity", "outcome": "hard_refusal", "category": None,
                         "dimension": d}))
        for d in chosen}


def round_means(audited: pd.DataFrame, judgements: pd.DataFrame, round_units: set[str],
                delta: DeclaredDelta, target: Target, unit: str = "source_id"
                ) -> list[float] | None:
    """The cluster mean of ``target.outcome`` per group of ``delta`` (values of
    ``target.group_column``) over the requests of one round's units (the ``unit`` column:
    sources, or base prompts; ``target.category`` only, when set): the mean of the outcome
    where it is observed; None when some group has no observed outcome in the round."""
    group = target.group_column
    rows = audited[audited[unit].astype(str).isin(round_units)]
    if target.category is not None:
        rows = rows[rows["category"] == target.category]
    rows = rows[rows[group].isin(delta.groups)]
    outcome = rows[["request_id", group]].merge(
        judgements[["request_id", target.outcome]], on="request_id", how="left")
    values = outcome[target.outcome].astype("boolean")
    observed = outcome[values.notna().to_numpy()]
    means = observed.assign(value=values.dropna().astype(float).to_numpy()) \
        .groupby(group)["value"].mean()
    if any(g not in means.index for g in delta.groups):
        return None
    return [float(means[g]) for g in delta.groups]


def round_outcomes(ctx: StageContext, model: str, judged: bool) -> pd.DataFrame:
    """Every outcome of ``model``'s requests so far, one row per request: the detectors'
    judgements and, with ``judged``, the judges' outcomes (:data:`JUDGE_OUTCOMES` of the
    ensemble verdicts; missing where the judges did not score a request, e.g. a refused one)."""
    judgements = read_table(ctx.path(layout.judgements_table(model)), JudgementRecord)
    if not judged:
        return judgements
    verdicts = read_table(ctx.path(layout.verdicts_table(model)), VerdictRecord)
    outcomes = [o for o in JUDGE_OUTCOMES if o in verdicts and o not in judgements]
    return judgements.merge(verdicts[["request_id", *outcomes]], on="request_id", how="left")


@dataclass(frozen=True)
class DeltaState:
    """One declared Δ after the rounds so far: its interval after each round (NaN before its
    first complete round), when it was decided (0: not yet) and what it supports now."""

    name: str
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    decided_round: int
    decision: str


def delta_state(name: str, delta: DeclaredDelta, observations: list[list[float] | None],
                level: float, top: float | None = None, *, method: Method = "hedged"
                ) -> DeltaState:
    """The confidence sequence of ``delta`` from its per-round group means (None: the round
    does not count for it), carried through the rounds that do not count. ``level`` is its
    pair CSs' level, ``top`` that of its upper bound alone (``upper_level``; None: none)."""
    complete = [i for i, means in enumerate(observations) if means is not None]
    lower = np.full(len(observations), np.nan)
    upper = np.full(len(observations), np.nan)
    if complete:
        low, high = delta_bounds(np.array([observations[i] for i in complete]), "range",
                                 level, method=method, upper_level=top)
        # Between complete rounds the interval stays what it was (nothing new was seen).
        at = np.searchsorted(complete, np.arange(len(observations)), side="right") - 1
        seen = at >= 0
        lower[seen], upper[seen] = low[at[seen]], high[at[seen]]
    decided = first_decided_round(np.nan_to_num(lower, nan=-np.inf),
                                  np.nan_to_num(upper, nan=np.inf), delta.margin)
    decision = "undecided" if np.isnan(lower[-1]) else decide(float(lower[-1]),
                                                               float(upper[-1]), delta.margin)
    return DeltaState(name=name, lower=tuple(float(v) for v in lower),
                      upper=tuple(float(v) for v in upper), decided_round=int(decided),
                      decision=decision)


@contextlib.contextmanager
def _untracked() -> Iterator[None]:
    """The stages a round runs inside the loop log nothing of their own: the loop's run
    (``generate``) logs each round."""
    before = os.environ.get("ACRB_MLFLOW")
    os.environ["ACRB_MLFLOW"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ACRB_MLFLOW", None)
        else:
            os.environ["ACRB_MLFLOW"] = before


def _declaration(ctx: StageContext, design: RoundDesign,
                 deltas: dict[str, tuple[DeclaredDelta, Target]]) -> dict[str, Any]:
    params = _params(ctx)
    groups = {name: list(delta.groups) for name, (delta, _) in deltas.items()}
    # upper_share at its default 0 is left out: the declaration of an audit begun before it
    # existed, which is resumed rather than restarted.
    exclude = {"upper_share"} if params.upper_share == 0 else None
    return {"params": params.model_dump(mode="json", exclude=exclude),
            "hypotheses": {name: target.declared for name, (_, target) in deltas.items()},
            # One list where every Δ is over the same groups (an editor's races), else by Δ.
            "groups": (next(iter(groups.values())) if len({tuple(g) for g in groups.values()})
                       == 1 else groups),
            "rounds": {str(k): int(v) for k, v in design.rounds.sort_index().items()}}


def _spent(params: SequentialParams, requests: int) -> dict[str, float]:
    return {"requests": requests, "dollars": requests * params.dollars_per_request,
            "gpu_hours": requests * params.gpu_seconds_per_request / 3600}


def _write_progress(ctx: StageContext, model: str, progress: dict[str, Any]) -> None:
    atomic_write_text(ctx.path(progress_path(model)),
                      json.dumps(progress, indent=2, sort_keys=True, allow_nan=False) + "\n")


def check_stopping_rule(ctx: StageContext) -> None:
    """Refuse to audit with settings the plan did not record: ``data/plan/stopping.json`` (the
    plan's :meth:`~acrb.config.Params.stopping_rule`) is how ``generate`` depends on the
    detectors', judges' and hypotheses' settings under DVC, so it must be the one in force."""
    path = ctx.path(layout.PLAN_STOPPING)
    try:
        stored = json.loads(path.read_text())["rule"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputDataError(f"{path} cannot be read as the plan's stopping rule: {exc}",
                             "run the plan stage again (`dvc repro plan` or `acrb plan`)"
                             ) from exc
    # As JSON reads it back (tuples as lists, paths as strings).
    current = json.loads(json.dumps(ctx.params.stopping_rule(), default=str))
    if stored != current:
        stored, current = stored or {}, current or {}
        changed = sorted(k for k in stored.keys() | current.keys()
                         if stored.get(k) != current.get(k))
        raise InputDataError(
            f"{path} was written for other settings than params.yaml's (they differ in: "
            f"{', '.join(changed) or 'plan.sequential'}), so the audit would stop by rules "
            "its plan did not record",
            "run the plan stage again (`dvc repro plan` or `acrb plan`), then generate")


def run(ctx: StageContext, model: str) -> generate.GenerateSummary:
    """Run ``model``'s audit round after round until it stops (see the module docstring);
    returns the generate summary of the rounds run, and leaves the progress file with the
    stop, its reason, the spending and every Δ's interval."""
    check_stopping_rule(ctx)
    params = _params(ctx)
    design = round_design(ctx, model)
    deltas = declared_deltas(ctx, model)
    declaration = _declaration(ctx, design, deltas)
    key = content_hash(declaration)
    previous = read_progress(ctx.root, model)
    # A change of what is declared (margin, budget, hypotheses, the sources) starts the
    # rounds again; every request already generated is reused.
    included = int(previous["included_rounds"]) if previous and previous["key"] == key else 0
    planned = _planned(ctx, model)
    audited = _audited(planned)
    unit = unit_column(planned)
    declared = [d for d, _ in deltas.values()]
    levels = {name: (pair_level(params.alpha, declared, delta, params.upper_share),
                     upper_level(params.alpha, declared, delta, params.upper_share))
              for name, (delta, _) in deltas.items()}
    observations: dict[str, list[list[float] | None]] = {name: [] for name in deltas}
    judged = any(target.outcome in JUDGE_OUTCOMES for _, target in deltas.values())
    generated = 0
    summary: generate.GenerateSummary | None = None
    states: dict[str, DeltaState] = {}
    reason = "budget"
    with stage_run("generate", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params, model=model,
                   simulated=ctx.params.model(model).model_class().simulated,
                   extra_tags={"sequential": "true"}) as tracker:
        for number in range(1, design.budget_rounds + 1):
            progress = _progress(model, key, declaration, design, max(included, number),
                                 observations, states, params, finished=False)
            if number > included:
                _write_progress(ctx, model, progress)
                included = number
            if number == included or summary is None:
                # A new round; or the first of a rerun, which finishes every round included
                # (a killed round's remaining requests) and reads what was stored.
                with _untracked():
                    summary = generate.run_requests(ctx, model)
                    evaluate.run(ctx, model)
                    if judged:
                        judge.run(ctx, model)
                generated += summary.generated
            judgements = round_outcomes(ctx, model, judged)
            sources = set(design.rounds.index[design.rounds == number])
            for name, (delta, target) in deltas.items():
                observations[name].append(round_means(audited, judgements, sources, delta,
                                                      target, unit))
            states = {name: delta_state(name, delta, observations[name], *levels[name],
                                        method=cast(Method, params.method))
                      for name, (delta, _) in deltas.items()}
            used = sum(design.requests_per_round[:number])
            _log_round(tracker, number, _spent(params, used), states)
            print(f"sequential {model}: round {number}/{design.budget_rounds}, {used:,} of "
                  f"{design.design_requests:,} requests; "
                  + "; ".join(f"{name} {_interval(state)} {state.decision}"
                              for name, state in states.items()), file=sys.stderr)
            if all(s.decision != "undecided" for s in states.values()):
                reason = "decided"
                break
        final = _progress(model, key, declaration, design, included, observations, states,
                          params, finished=True, stop_round=number, reason=reason)
        _write_progress(ctx, model, final)
        metrics = flat_metrics(final)
        # At the stop's step; each Δ's interval is in its per-round history already.
        tracker.log_metrics({k: v for k, v in metrics.items()
                             if not k.endswith((".lower", ".upper"))}, step=number)
        # Beside the audit's headline on the pipeline's run: what stopping early saved.
        tracker.log_on_parent({f"{model}.{k}": metrics[k] for k in
                               ("sequential.stop_round", "sequential.saved_fraction")})
    assert summary is not None
    return generate.GenerateSummary(
        model=model, planned=summary.planned, skipped=summary.planned - generated,
        generated=generated, status_counts=summary.status_counts, complete=summary.complete,
        seconds_model=summary.seconds_model, seconds_total=summary.seconds_total,
        table=summary.table)


def _progress(model: str, key: str, declaration: dict[str, Any], design: RoundDesign,
              included: int, observations: dict[str, list[list[float] | None]],
              states: dict[str, DeltaState], params: SequentialParams, *, finished: bool,
              stop_round: int | None = None, reason: str | None = None) -> dict[str, Any]:
    measured = len(next(iter(observations.values()), []))
    used = sum(design.requests_per_round[:measured])
    return {
        "version": PROGRESS_VERSION, "model": model, "key": key, "declaration": declaration,
        "included_rounds": included, "measured_rounds": measured, "finished": finished,
        "available_rounds": len(design.requests_per_round),
        "budget_rounds": design.budget_rounds, "budget_limit": design.budget_reason,
        "requests_per_round": list(design.requests_per_round),
        "stop": None if not finished else {"round": stop_round, "reason": reason},
        "spent": _spent(params, used), "design": _spent(params, design.design_requests),
        "deltas": {name: {"observations": observations[name],
                          **({"lower": _plain(states[name].lower),
                              "upper": _plain(states[name].upper),
                              "decided_round": states[name].decided_round,
                              "decision": states[name].decision} if name in states else {})}
                   for name in observations},
    }


def _interval(state: DeltaState) -> str:
    if np.isnan(state.lower[-1]):
        return "[no complete round yet]"
    return f"[{state.lower[-1]:.3f}, {state.upper[-1]:.3f}]"


def _plain(values: tuple[float, ...]) -> list[float | None]:
    return [None if np.isnan(v) else v for v in values]


def _log_round(tracker: RunLog, number: int, spent: dict[str, float],
               states: dict[str, DeltaState]) -> None:
    metrics = {f"sequential.{k}": v for k, v in spent.items()}
    for name, state in states.items():
        if not np.isnan(state.lower[-1]):
            metrics[f"sequential.{name}.lower"] = state.lower[-1]
            metrics[f"sequential.{name}.upper"] = state.upper[-1]
    tracker.log_metrics(metrics, step=number)
