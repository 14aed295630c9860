"""Stage `judge@<model>`: every judge of ``judge.use`` scores the model's outputs; the scores are
combined by the ensemble rule and the judge outcomes are read from them.

A judge sees the outputs the detectors did not find refused (status ``ok`` and not a hard
refusal by :mod:`acrb.stages.evaluate`): a refused or errored request is recorded as
``not_judged``. Each answer is one record of ``data/scores/<model>/<judge>/records.jsonl``
(:class:`acrb.journal.RecordStore`), stored as soon as its batch is answered, so a crash loses
at most one batch; an answer is reused while the judge's identity and rubric (its ``judge_id``)
and the output's sha256 are unchanged, and ``error`` answers are asked again. VLM replies are
also cached by content hash (``judge.cache_dir``). Tables: ``<judge>.parquet`` per judge and
``verdicts.parquet`` with the combined scores, ``needs_review`` and the outcomes of
``judge.outcomes``.

A real judge is not told the source's race, gender or age unless its params say its prompt
states them (``judges.<name>.prompt.labels``, as the seed study's judge prompt does); each
answer then records ``labels_given``. Every outcome of ``judge.outcomes`` must read an axis the
rubric scores (``acrb-v1`` or ``study-v1``).

Changing a judge threshold re-runs this stage (every answer is reused, only the verdicts are
recomputed) and the analysis; generation and the detectors are untouched.

The judges run in this process or on a Ray cluster (``judge.runner``; :mod:`acrb.runners`),
with the same records either way; each answer's seconds and where it ran go to the timing log
``logs/timings/judge/<model>.jsonl`` (:mod:`acrb.timings`), which is no output.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from acrb import layout
from acrb.config import JudgeEntry, OutcomeRule, Params, WinoBiasParams
from acrb.detect.face import remember_faces_file
from acrb.errors import ConfigError, InputDataError
from acrb.journal import RecordStore
from acrb.judges.base import Judge
from acrb.judges.ensemble import check_rule, combine, read_outcomes
from acrb.judges.items import JudgeAnswer, JudgeItem, PixelReading
from acrb.judges.rubric import Rubric, check_stored_scores, load_rubric
from acrb.judges.simulated import pixel_readings
from acrb.judges.winobias import ROLE_QUESTIONS, RoleRubric, combine_roles, load_role_rubric
from acrb.prompts.winobias import ITEMS_TABLE as WINOBIAS_ITEMS
from acrb.prompts.winobias import read_items
from acrb.records import (
    SCORE_AXES,
    GenerationRecord,
    JudgementRecord,
    ScoreRecord,
    VerdictRecord,
    read_table,
    write_table,
)
from acrb.runners import run_batches
from acrb.stages.context import StageContext
from acrb.storage import load_rgb, remove_stale_temporaries
from acrb.timings import (
    append_timings,
    measured,
    timings_path,
    utc_now,
)
from acrb.tracking import stage_run, tracking_root

T = TypeVar("T")


@dataclass(frozen=True)
class JudgeSummary:
    model: str
    judges: tuple[str, ...]
    asked: dict[str, int]
    reused: dict[str, int]
    statuses: dict[str, dict[str, int]]
    needs_review: int
    table: Path | None


def open_judge(name: str, entry: JudgeEntry, rubric: Rubric | RoleRubric, params: Params,
               cache_dir: Path) -> Judge:
    """The judge ``name`` of params ``judges`` (nothing heavy is loaded until it answers)."""
    if entry.kind == "simulated":
        from acrb.judges.planted import SimulatedJudgeConfig
        from acrb.judges.simulated import SimulatedJudge

        try:
            config = SimulatedJudgeConfig.model_validate(entry.config)
        except ValueError as exc:
            raise ConfigError(f"judges.{name}.config is not a simulated judge's config: {exc}",
                              "see the simulated judges of the default params.yaml") from None
        return SimulatedJudge(name, rubric, config, params.evaluate.thresholds)
    from acrb.judges.vlm import VLMJudge

    assert entry.backend is not None  # checked by JudgeEntry
    return VLMJudge(name, entry.backend, rubric, cache_dir / name, entry.prompt)


def states_labels(entry: JudgeEntry) -> bool:
    """Whether the judge of ``entry`` is a real judge whose prompt states the source's labels
    (params ``judges.<name>.prompt.labels``): only then does its item carry them."""
    return entry.kind == "vlm" and entry.prompt.labels


def check_outcome_axes(outcomes: Mapping[str, OutcomeRule], rubric: Rubric) -> None:
    """ConfigError when an outcome of params ``judge.outcomes`` reads an axis ``rubric`` does
    not score (it would be None everywhere, which reads as 'not measured', not as 'never')."""
    missing = {name: rule.axis for name, rule in outcomes.items() if rule.axis not in rubric.axes}
    if missing:
        listed = ", ".join(f"{name} ({axis})" for name, axis in missing.items())
        raise ConfigError(
            f"judge.outcomes read axes that rubric {rubric.label} does not score: {listed}",
            f"drop those outcomes from judge.outcomes or point them at one of the rubric's "
            f"axes ({', '.join(rubric.axes)}); with the study rubric see docs/judges.md")


def attribute_phrase(attribute: str) -> str | None:
    """The requested attribute in words for the rubric: ``occupation:doctor`` -> ``doctor
    (occupation)``; None for a neutral request."""
    if not attribute or attribute == "neutral":
        return None
    if ":" in attribute:
        dimension, value = attribute.split(":", 1)
        return f"{value.replace('-', ' ')} ({dimension.replace('-', ' ')})"
    return attribute.replace("-", " ")


def _not_judged_reason(generation: GenerationRecord, judgement: dict[str, Any] | None
                       ) -> str | None:
    """Why ``generation`` is not shown to the judges, or None when it is."""
    if generation.status != "ok":
        return f"generation {generation.status}"
    if judgement is None:
        return "no detector judgement"
    if judgement.get("hard_refusal"):
        return f"hard refusal ({judgement.get('refusal_evidence')})"
    return None


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _score_record(base: dict[str, Any], answer: JudgeAnswer) -> ScoreRecord:
    scores = {axis: answer.scores.get(axis) for axis in SCORE_AXES}
    return ScoreRecord.model_validate({
        **base, "status": answer.status,
        **{a: (None if v is None else float(v) if a == "cue_retention" else int(v))
           for a, v in scores.items()},
        **{q: answer.scores.get(q) for q in ROLE_QUESTIONS},
        "reason": answer.reason, "raw": json.dumps(list(answer.raw), ensure_ascii=False),
        "call_ids": ",".join(answer.call_ids), "attempts": answer.attempts,
        "labels_given": answer.labels_given,
    })


def reusable(record: ScoreRecord | None, judge_id: str, image_sha256: str | None,
             judged: bool) -> bool:
    """Whether the stored answer ``record`` stands for an output of ``image_sha256`` under the
    judge ``judge_id``: same judge and rubric, same image, not an error, and judged (or
    ``not_judged``) as the output now is. Anything else is asked (or recorded) again."""
    return (record is not None and record.judge_id == judge_id
            and record.image_sha256 == image_sha256 and record.status != "error"
            and (record.status != "not_judged") == judged)


#: The source's group labels: a simulated judge, which plants its errors by them, gets them; a
#: real judge only where its prompt states them (params ``judges.<name>.prompt.labels``).
DESIGN = ("race", "gender", "age")
#: The plan columns a real judge's item is built from: no group label among them, so neither a
#: Ray actor nor the judge it holds receives the race, gender or age of the source, unless the
#: judge's prompt states them (:func:`states_labels`: then :data:`DESIGN` is added).
ITEM_COLUMNS = ("prompt_text", "mode", "attribute", "seed", "source_path", "extra_sources")


@dataclass(frozen=True)
class JudgeTask:
    """One output to ask a judge about: what the worker needs to build its item and record."""

    request_id: str
    model: str
    judge_id: str
    generation: GenerationRecord
    request: dict[str, Any]
    reading: PixelReading | None
    roles: dict[str, str] | None


class JudgeWorker:
    """One judge asked batch by batch, each answer written as its record: what the local runner
    runs in the stage's process and what each Ray actor holds (:mod:`acrb.runners`), so both
    write the same records.

    Built once (the judge is opened: a local VLM is loaded); called with a batch of tasks, it
    keeps each answer already recorded (on a batch retried after a lost actor, those it wrote
    before), asks the judge about the rest, writes their records and returns one record per
    task.
    """

    def __init__(self, ctx: StageContext, name: str, entry: JudgeEntry,
                 rubric: Rubric | RoleRubric, cache_dir: Path, timings_log: Path,
                 store: RecordStore[ScoreRecord]) -> None:
        self.ctx, self.name, self.timings_log = ctx, name, timings_log
        self.store = store
        # What earlier workers of this run stored (a batch is retried after a lost actor), then
        # what this one stores: the stage left out what was answered before it started.
        self.written: dict[str, ScoreRecord] = store.load(journals_only=True)
        self.labels = states_labels(entry)
        self.judge = open_judge(name, entry, rubric, ctx.params, cache_dir)
        self.judge.__enter__()
        self.load_source = _cached_loader(ctx)
        # A simulated judge reads the skin where the face is: the sources stage located it once.
        remember_faces_file(ctx.path(layout.SOURCE_FACES))

    def close(self) -> None:
        self.judge.__exit__(None, None, None)

    def __call__(self, batch: list[JudgeTask]) -> list[ScoreRecord]:
        done: dict[str, ScoreRecord] = {}
        for task in batch:
            record = self.written.get(task.request_id)
            if reusable(record, task.judge_id, task.generation.image_sha256, judged=True):
                assert record is not None
                done[task.request_id] = record
        todo = [t for t in batch if t.request_id not in done]
        if todo:
            items = [_item(self.ctx, t.request_id, t.generation, t.request, self.load_source,
                           t.reading, t.roles, labels=self.labels,
                           pixels=not (self.judge.reads_reading and t.reading is not None))
                     for t in todo]
            tick = time.perf_counter()
            answers = self.judge.judge_many(items)
            seconds = round((time.perf_counter() - tick) / len(todo), 6)
            finished_at = utc_now()
            timings = []
            made = []
            for task, answer in zip(todo, answers, strict=True):
                record = _score_record(
                    {"request_id": task.request_id, "model": task.model, "judge": self.name,
                     "judge_id": task.judge_id,
                     "image_sha256": task.generation.image_sha256}, answer)
                made.append(record)
                done[task.request_id] = record
                timings.append(measured(
                    request_id=task.request_id, stage="judge", model=task.model,
                    judge=self.name, status=record.status, seconds=seconds,
                    batch_size=len(todo), finished_at=finished_at))
            self.store.append(made)
            self.written.update((r.request_id, r) for r in made)
            append_timings(self.timings_log, timings)  # after the records, as in generate
        return [done[t.request_id] for t in batch]


def run(ctx: StageContext, model: str) -> JudgeSummary:
    params = ctx.params
    params.model(model)
    cfg = params.judge
    names = tuple(cfg.use)
    unknown = [n for n in names if n not in params.judges]
    if unknown:
        raise ConfigError(f"judge.use names {unknown}, which are not under `judges`",
                          "use some of: " + (", ".join(params.judges) or "(none declared)"))
    check_rule(cfg.ensemble, names)
    out_dir = ctx.path(layout.scores_dir(model))
    out_dir.mkdir(parents=True, exist_ok=True)
    if not names:
        # No judges: the folder stays, without tables; the analysis then has no judge outcomes.
        for stale in out_dir.glob("*.parquet"):
            stale.unlink()
        return JudgeSummary(model, (), {}, {}, {}, 0, None)
    rubric = load_rubric(ctx.path(cfg.rubric))
    check_outcome_axes(cfg.outcomes, rubric)
    generations = read_table(ctx.path(layout.generations_table(model)), GenerationRecord)
    judgements_path = ctx.path(layout.judgements_table(model))
    if not judgements_path.exists():
        raise InputDataError(f"no detector judgements for model '{model}' ({judgements_path})",
                             f"run `acrb evaluate --model {model}` (or `dvc repro`) first")
    judgements = read_table(judgements_path, JudgementRecord).set_index("request_id")
    requests = ctx.model_requests(model).set_index("request_id")
    roles = winobias_roles(ctx, requests)
    role_rubric = load_role_rubric(ctx.path(
        params.winobias.rubric if params.winobias else WinoBiasParams().rubric)) \
        if roles else None
    rows = generations.astype(object).where(generations.notna(), None).to_dict("records")
    outputs = {r["request_id"]: GenerationRecord.model_validate(r) for r in rows}
    judgement_rows = judgements.astype(object).where(judgements.notna(), None)
    reasons = {
        rid: _not_judged_reason(g, judgement_rows.loc[rid].to_dict()
                                if rid in judgement_rows.index else None)
        for rid, g in outputs.items()
    }
    readings = pixel_readings(judgements, params.evaluate.thresholds)
    timings_log = timings_path(tracking_root(ctx.root), "judge", model)
    per_judge: dict[str, dict[str, ScoreRecord]] = {}
    asked: dict[str, int] = {}
    reused: dict[str, int] = {}
    with stage_run("judge", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params, model=model,
                   simulated=params.profile.simulation) as tracker:
        remove_stale_temporaries(out_dir)  # the tables' too, not only each judge's folder
        for name in names:
            judge = open_judge(name, params.judges[name], rubric, params,
                               ctx.path(cfg.cache_dir))
            # WinoBias outputs get the role question, asked by the same judge.
            role_judge = None if role_rubric is None else open_judge(
                name, params.judges[name], role_rubric, params, ctx.path(cfg.cache_dir))
            ids = {rid: judge.judge_id if role_judge is None or rid not in roles
                   else role_judge.judge_id for rid in outputs}
            (out_dir / name).mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(out_dir / name)
            store = RecordStore(out_dir / name, ScoreRecord)
            stored = store.load()
            # Answers read back flow into the verdicts: a score this rubric cannot give (a
            # record edited by hand) is refused, never combined.
            check_stored_scores(rubric, name, store.folder, {
                rid: {axis: getattr(record, axis) for axis in SCORE_AXES}
                for rid, record in stored.items()
                if record.status == "scored" and record.judge_id == judge.judge_id})
            answers: dict[str, ScoreRecord] = {}
            todo: list[str] = []
            kept = 0
            unjudged: list[ScoreRecord] = []
            for rid, generation in outputs.items():
                record = stored.get(rid)
                judge_id = ids[rid]
                if reusable(record, judge_id, generation.image_sha256,
                            judged=reasons[rid] is None):
                    assert record is not None
                    answers[rid] = record
                    kept += 1
                elif reasons[rid] is not None:
                    record = ScoreRecord(request_id=rid, model=model, judge=name,
                                         judge_id=judge_id,
                                         image_sha256=generation.image_sha256,
                                         status="not_judged", reason=str(reasons[rid]))
                    unjudged.append(record)
                    answers[rid] = record
                else:
                    todo.append(rid)
            store.append(unjudged)
            reused[name] = kept
            asked[name] = len(todo)
            work: list[tuple[Rubric | RoleRubric, list[str]]] = [
                (rubric, [rid for rid in todo if rid not in roles])]
            if role_rubric is not None:
                work.append((role_rubric, [rid for rid in todo if rid in roles]))
            for asked_rubric, asked_ids in work:
                entry = params.judges[name]
                shown = (list(requests.columns) if entry.kind == "simulated"
                         else [c for c in (*ITEM_COLUMNS, *(DESIGN if states_labels(entry)
                                                            else ()))
                               if c in requests.columns])
                # One conversion of the plan rows asked about, not a lookup per task.
                plan_rows = requests.loc[asked_ids, shown].to_dict("index")
                tasks = [JudgeTask(rid, model, ids[rid], outputs[rid],
                                   {str(k): v for k, v in plan_rows[rid].items()},
                                   readings.get(rid), roles.get(rid))
                         for rid in asked_ids]
                batches = [list(b) for b in _batches(tasks, cfg.batch_size)]
                make_worker = partial(JudgeWorker, ctx, name, params.judges[name],
                                      asked_rubric, ctx.path(cfg.cache_dir), timings_log, store)
                for records in run_batches(cfg.runner, make_worker, batches,
                                           ray_params=params.ray,
                                           desc=f"judge {model} / {name}", unit="img"):
                    answers.update((r.request_id, r) for r in records)
            ordered = [answers[rid] for rid in outputs]
            with store.locked():
                store.finish()
                write_table(ctx.path(layout.scores_table(model, name)), ordered, ScoreRecord)
            per_judge[name] = answers
        verdicts = [_verdict(model, rid, names, per_judge, rubric, params, rid in roles)
                    for rid in outputs]
        table = ctx.path(layout.verdicts_table(model))
        write_table(table, verdicts, VerdictRecord)
        statuses: dict[str, dict[str, int]] = {
            name: dict(Counter(str(r.status) for r in per_judge[name].values()))
                    for name in names}
        review = sum(v.needs_review for v in verdicts)
        tracker.log_params({
            "model": model, "judges": ", ".join(names), "rubric": rubric.label,
            "ensemble": cfg.ensemble,
            **{f"judge.{n}.id": per_judge[n][next(iter(outputs))].judge_id
               for n in names if outputs},
            **{f"judge.{n}.prompt": json.dumps(params.judges[n].prompt.model_dump())
               for n in names if params.judges[n].prompt.enabled},
            **{f"outcome.{k}": _describe_rule(v) for k, v in cfg.outcomes.items()},
        })
        metrics: dict[str, float] = {"needs_review": float(review)}
        for name in names:
            metrics[f"{name}.asked"] = float(asked[name])
            metrics[f"{name}.reused"] = float(reused[name])
            for status, count in statuses[name].items():
                metrics[f"{name}.{status}"] = float(count)
        frame = pd.DataFrame([v.model_dump() for v in verdicts])
        for outcome in cfg.outcomes:
            if outcome in frame:
                metrics[f"outcome.{outcome}"] = float(frame[outcome].eq(True).sum())
        tracker.log_metrics(metrics)
    return JudgeSummary(model, names, asked, reused, statuses, review, table)


def _describe_rule(rule: Any) -> str:
    for word, bound in (("<=", rule.at_most), (">=", rule.at_least), ("<", rule.below)):
        if bound is not None:
            return f"{rule.axis} {word} {bound:g}"
    if rule.outside is not None:
        low, high = rule.outside
        return f"{rule.axis} outside [{low:g}, {high:g}]"
    return rule.axis


def _verdict(model: str, rid: str, names: Sequence[str],
             per_judge: dict[str, dict[str, ScoreRecord]], rubric: Rubric,
             params: Params, winobias: bool = False) -> VerdictRecord:
    records = [per_judge[n][rid] for n in names]
    base: dict[str, Any] = {"request_id": rid, "model": model, "judges": ",".join(names),
                            "rule": params.judge.ensemble}
    if all(r.status == "not_judged" for r in records):
        return VerdictRecord.model_validate({**base, "status": "not_judged"})
    scored = [{a: getattr(r, a) for a in SCORE_AXES} if r.status == "scored" else {}
              for r in records]
    if winobias:
        # The role question: its own combination rule, no rubric axes.
        answered = [{q: getattr(r, q) for q in ROLE_QUESTIONS} if r.status == "scored" else {}
                    for r in records]
        if not any(answered):
            return VerdictRecord.model_validate({**base, "status": "abstained"})
        holders, review = combine_roles(answered)
        return VerdictRecord.model_validate({
            **base, "status": "scored", **holders, "needs_review": bool(review),
            "review_axes": ",".join(review)})
    if not any(scored):
        return VerdictRecord.model_validate({**base, "status": "abstained"})
    combined = combine(scored, rubric, params.judge.ensemble)
    outcomes = read_outcomes(combined.scores, params.judge.outcomes)
    return VerdictRecord.model_validate({
        **base, "status": "scored", **combined.scores,
        "needs_review": bool(combined.review_axes),
        "review_axes": ",".join(combined.review_axes), **outcomes})


def _item(ctx: StageContext, rid: str, generation: GenerationRecord, request: Any,
          load_source: Callable[[str], np.ndarray], reading: PixelReading | None = None,
          roles: dict[str, str] | None = None, *, labels: bool = False,
          pixels: bool = True) -> JudgeItem:
    """The item a judge is asked about. The source's groups (present in ``request`` only for a
    simulated judge, or a real one whose prompt states them) go to ``design`` for a simulated
    judge, to ``labels`` with ``labels`` (a real judge told them), never both. Without
    ``pixels`` (a judge that reads ``reading`` instead, :attr:`Judge.reads_reading`) an edit's
    images are not decoded."""
    assert generation.image_path is not None
    group = {d: str(request[d]) for d in DESIGN if d in request}
    design, told = ({}, group) if labels else (group, {})
    if not pixels and roles is None and str(request["mode"]) != "t2i":
        assert reading is not None
        return JudgeItem(
            request_id=rid, instruction=str(request["prompt_text"]), output=None, edit=True,
            attribute=attribute_phrase(str(request["attribute"])),
            design=design, labels=told, seed=int(request["seed"]), reading=reading)
    output = load_rgb(ctx.path(generation.image_path))
    if roles is not None:
        # A WinoBias output: both input portraits and the two occupations asked about.
        return JudgeItem(
            request_id=rid, instruction=str(request["prompt_text"]), output=output,
            source=load_source(str(request["source_path"])),
            extra_sources=tuple(load_source(str(o["path"]))
                                for o in json.loads(str(request["extra_sources"]) or "[]")),
            roles=roles, design=design, seed=int(request["seed"]))
    if str(request["mode"]) == "t2i":
        return JudgeItem(request_id=rid, instruction=str(request["prompt_text"]), output=output,
                         attribute=attribute_phrase(str(request["attribute"])),
                         seed=int(request["seed"]))
    return JudgeItem(
        request_id=rid, instruction=str(request["prompt_text"]), output=output,
        source=load_source(str(request["source_path"])),
        attribute=attribute_phrase(str(request["attribute"])),
        design=design, labels=told, seed=int(request["seed"]), reading=reading,
    )


def winobias_roles(ctx: StageContext, requests: pd.DataFrame) -> dict[str, dict[str, str]]:
    """The occupations each WinoBias request of ``requests`` (indexed by request id) asks
    about, {"male": ..., "female": ...}, from the plan's WinoBias items."""
    wino = requests[requests["experiment"] == "winobias"]
    if wino.empty:
        return {}
    items = read_items(ctx.path(WINOBIAS_ITEMS))
    missing = sorted(set(wino["prompt_id"].astype(str)) - set(items))
    if missing:
        raise InputDataError(f"WinoBias requests of items {missing[:5]} have no entry in "
                             f"{WINOBIAS_ITEMS}", "re-run `acrb plan` (or `dvc repro`)")
    return {str(rid): {"male": items[str(p)].male_role, "female": items[str(p)].female_role}
            for rid, p in wino["prompt_id"].items()}


def _cached_loader(ctx: StageContext) -> Callable[[str], np.ndarray]:
    """Load each source image once (sources repeat across requests); the same array object is
    handed out each time, so a judge can cache what it derives from a source."""
    cache: dict[str, np.ndarray] = {}

    def load(path: str) -> np.ndarray:
        if path not in cache:
            cache[path] = load_rgb(ctx.path(path))
        return cache[path]

    return load
