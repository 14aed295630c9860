"""Stage `generate@<model>`: run one model over its planned requests, resumably.

For each request the output image is written first (atomically), then its record, appended to
the output's journal (:class:`acrb.journal.RecordStore`); a record therefore only exists for a
complete image, and a rerun skips every request whose record is present and whose image still
matches the recorded sha256. A crash or ``kill -9`` loses at most
the batch in flight. The model runs in this process or on actors of a Ray cluster
(``generate.runner``; :mod:`acrb.runners`), which write the same records. ``--shard i/N``
takes the requests whose id hashes to ``i`` modulo ``N``, so N processes (or machines sharing
the folder) can split the work. At the end the journal is folded into
``records.jsonl`` and the records of all the model's planned requests are gathered into
``generations.parquet``.

A record holds only what its request determines, so that a rerun writes the same bytes and
``dvc.lock`` stays as it was; the seconds each request took, when and where it ran go to the
timing log ``logs/timings/generate/<model>.jsonl`` (:mod:`acrb.timings`), which is no output.

Records are read through :class:`acrb.journal.RecordStore`: one written by an older ACRB is
migrated, and one that cannot be read stops the stage rather than being silently redone.

An editor gets each request's images, instruction and seed only; a generator the prompt and
seed. A simulated model also gets the plan rows of its requests (its planted behaviour depends
on the source's groups and the prompt's attribute) through
:meth:`~acrb.models.base.Simulated.attach_design`; no other model ever does.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from tqdm import tqdm

from acrb import __version__, layout
from acrb.config import ModelEntry
from acrb.errors import AcrbError, ConfigError, InputDataError
from acrb.journal import RecordStore
from acrb.models.base import (
    Editor,
    EditRequest,
    GenerationRequest,
    Generator,
    ImageModel,
    Outcome,
    Simulated,
)
from acrb.records import (
    GenerationRecord,
    RequestRecord,
    upgrade_records,
    write_table,
)
from acrb.runners import run_batches
from acrb.stages.context import StageContext
from acrb.storage import (
    canonical_json,
    load_rgb,
    remove_stale_temporaries,
    sha256_file,
    write_png,
)
from acrb.timings import (
    RequestTiming,
    append_timings,
    here,
    measured,
    timings_path,
    utc_now,
)
from acrb.tracking import stage_run, tracking_root


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index_text, count_text = text.split("/")
            shard = cls(int(index_text), int(count_text))
        except ValueError as exc:
            raise AcrbError(f"--shard {text!r} is not of the form i/N",
                            "e.g. --shard 0/4 for the first of four shards") from exc
        if shard.count < 1 or not 0 <= shard.index < shard.count:
            raise AcrbError(f"--shard {text!r}: need 0 <= i < N", "e.g. --shard 3/4")
        return shard

    def owns(self, request_id: str) -> bool:
        return int(request_id[:12], 16) % self.count == self.index


@dataclass(frozen=True)
class GenerateSummary:
    model: str
    planned: int
    skipped: int
    generated: int
    status_counts: dict[str, int]
    complete: bool
    seconds_model: float
    seconds_total: float
    table: Path | None


def read_finished(records: Mapping[str, GenerationRecord], root: Path, request_ids: list[str],
                  verify: bool, retry_errors: bool, output_version: int | None
                  ) -> dict[str, GenerationRecord]:
    """The requests of ``request_ids`` that are done: their record is among ``records`` (a
    :class:`~acrb.journal.RecordStore`'s), made by the adapter's ``output_version``
    (:attr:`acrb.models.base.ImageModel.output_version`), their image is present (and, with
    ``verify``, still has the recorded sha256), and they did not end in error when
    ``retry_errors``. Those are the only reasons to redo a request."""
    finished: dict[str, GenerationRecord] = {}
    for request_id in request_ids:
        record = records.get(request_id)
        if record is None or record.output_version != output_version:
            continue
        if record.status == "error" and retry_errors:
            continue
        if record.image_path is not None:
            image = root / record.image_path
            if not image.exists() or (verify and sha256_file(image) != record.image_sha256):
                continue
        finished[request_id] = record
    return finished


class SourceLoader:
    """Source images, loaded once each and checked to be the bytes the plan was made from.

    :meth:`prefetch` starts loading the sources of the next batch on a background thread
    while the model works on this one, so a GPU never waits on PNG decoding; a failure there
    (missing or changed file) is raised when the image is asked for, as if loaded then.
    """

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self._cache: dict[str, Future[np.ndarray]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _load(self, path: str, expected_sha256: str) -> np.ndarray:
        absolute = self.ctx.path(path)
        if not absolute.exists():
            raise InputDataError(f"source image {absolute} not found",
                                 "re-run `dvc repro` so the sources stage restores it")
        if sha256_file(absolute) != expected_sha256:
            raise InputDataError(
                f"source image {absolute} changed since the plan was made",
                "re-run `dvc repro` (sources and plan) so requests match the images",
            )
        return load_rgb(absolute)

    def prefetch(self, path: str, expected_sha256: str) -> None:
        """Start loading ``path`` in the background (once)."""
        with self._lock:
            if path in self._cache:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="acrb-sources")
            self._cache[path] = self._pool.submit(self._load, path, expected_sha256)

    def __call__(self, path: str, expected_sha256: str) -> np.ndarray:
        with self._lock:
            future = self._cache.get(path)
            if future is None:
                future = Future()
                try:
                    future.set_result(self._load(path, expected_sha256))
                except BaseException as exc:
                    future.set_exception(exc)
                self._cache[path] = future
        return future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _source_loader(ctx: StageContext) -> SourceLoader:
    """Load source images once each, checking they are the bytes the plan was made from."""
    return SourceLoader(ctx)


class BatchWriter:
    """Writes each finished batch (images, records, timings) on a background thread, so the
    model starts on the next batch at once instead of waiting for PNG encoding and disk.

    Bounded: at most ``depth`` batches wait to be written; :meth:`submit` blocks until there
    is room, and raises the failure of any earlier write (a full disk stops the stage at the
    next batch, not at the end). :meth:`drain` waits for every write and raises the first
    failure; the stage drains before it gathers the records. A kill therefore loses at most
    the batch on the model and the ``depth`` batches being written, whose records were not
    stored yet: the rerun redoes them.
    """

    def __init__(self, depth: int = 1) -> None:
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="acrb-writer")
        self._pending: deque[Future[None]] = deque()

    def submit(self, write: Callable[[], None]) -> None:
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(write))

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)


#: Threads that PNG-encode the images of one batch in parallel (zlib releases the GIL).
ENCODE_THREADS = max(1, min(4, os.cpu_count() or 1))
_ENCODER: ThreadPoolExecutor | None = None
_ENCODER_LOCK = threading.Lock()


def _encoder() -> ThreadPoolExecutor:
    global _ENCODER
    with _ENCODER_LOCK:
        if _ENCODER is None:
            _ENCODER = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="acrb-png")
        return _ENCODER


#: Set in the environment of a generate stage started by :func:`delegate`, so that it runs
#: the model itself instead of delegating again.
DELEGATED_ENV = "ACRB_GENERATE_DELEGATED"


def delegate(ctx: StageContext, model: str, params_path: Path, shard: Shard | None = None
             ) -> int | None:
    """Run the generate stage of ``model`` in the interpreter its params entry names
    (``models.<name>.python``) and return its exit status; None when there is none to run in
    (no ``python`` set, this process is that interpreter, or it was itself delegated).

    A model whose library replaces one the others need (Step1X-Edit-v1p2 runs on its authors'
    fork of diffusers) lives in an environment of its own; ``dvc repro`` still runs every stage
    from one command, and only this stage crosses to the other environment.
    """
    entry = ctx.params.model(model)
    if entry.python is None or os.environ.get(DELEGATED_ENV):
        return None
    python = ctx.path(entry.python)
    if python.absolute() == Path(sys.executable).absolute():
        return None
    if not python.exists():
        raise ConfigError(
            f"models.{model}.python is {entry.python}, which does not exist",
            f"create that environment (docs/models.md says how for {entry.key}) or remove "
            f"models.{model}.python",
        )
    command = [str(python), "-m", "acrb", "generate", "--model", model,
               "--params", str(params_path)]
    if shard is not None:
        command += ["--shard", f"{shard.index}/{shard.count}"]
    return subprocess.run(command, cwd=ctx.root, env={**os.environ, DELEGATED_ENV: "1"},
                          check=False).returncode


def run(ctx: StageContext, model: str, shard: Shard | None = None) -> GenerateSummary:
    """Run ``model`` over its planned requests (those of ``shard``); in a sequential audit
    (``plan.sequential``) an image editor's requests in rounds, until its audit stops
    (:mod:`acrb.sequential_audit`)."""
    if ctx.params.plan.sequential is not None:
        from acrb import sequential_audit as sequential

        if sequential.runs_in_rounds(ctx, model):
            if shard is not None:
                raise ConfigError(
                    f"model '{model}' is audited in rounds (plan.sequential), which one "
                    "process runs from the first round to the stop",
                    "run `acrb generate` without --shard (runner: ray spreads each round "
                    "over a cluster)")
            return sequential.run(ctx, model)
    return run_requests(ctx, model, shard)


def run_requests(ctx: StageContext, model: str, shard: Shard | None = None
                 ) -> GenerateSummary:
    """Generate every planned request of ``model`` (of ``shard``) that has no finished record
    yet, and write its generations table."""
    ctx.params.check_model_configs()
    entry = ctx.params.model(model)
    started = time.perf_counter()
    requests = ctx.model_requests(model)
    all_ids = requests["request_id"].tolist()
    mine = requests if shard is None else requests[requests["request_id"].map(shard.owns)]
    out_dir = ctx.path(layout.generations_dir(model))
    images_dir = out_dir / "images"
    store = RecordStore(out_dir, GenerationRecord)
    images_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    # Under the project an experiment was started from, so a queued or temporary experiment's
    # timings outlive its copy (like its MLflow runs).
    timings_log = timings_path(tracking_root(ctx.root), "generate", model)
    _upgrade_records(store, timings_log)
    shard_name = "all" if shard is None else f"{shard.index}/{shard.count}"
    cfg = ctx.params.generate
    output_version = entry.model_class().output_version
    finished = read_finished(store.load(), ctx.root, mine["request_id"].tolist(),
                             cfg.verify_existing, cfg.retry_errors, output_version)
    pending = mine[~mine["request_id"].isin(finished)]
    simulated = entry.model_class().simulated
    seconds_model = 0.0
    with stage_run("generate", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params, model=model,
                   simulated=simulated) as tracker:
        if len(pending):
            seconds_model = _generate(ctx, entry, pending, store, images_dir, cfg.batch_size,
                                      timings_log, shard_name)
        table = ctx.path(layout.generations_table(model))
        with store.locked():
            records = read_finished(store.finish(), ctx.root, all_ids, verify=False,
                                    retry_errors=False, output_version=output_version)
            write_table(table, [records[i] for i in all_ids if i in records], GenerationRecord)
        complete = len(records) == len(all_ids)
        status_counts: dict[str, int] = dict(Counter(r.status for r in records.values()))
        total = time.perf_counter() - started
        tracker.log_params({"model": model, "model_key": entry.key,
                            "model_revision": entry.resolved_revision(),
                            "batch_size": cfg.batch_size,
                            "shard": shard_name})
        tracker.log_metrics({
            "requests.planned": len(all_ids), "requests.skipped": len(finished),
            "requests.generated": len(pending),
            **{f"status.{k}": v for k, v in status_counts.items()},
            "seconds.model": seconds_model, "seconds.total": total,
        })
    return GenerateSummary(
        model=model, planned=len(all_ids), skipped=len(finished), generated=len(pending),
        status_counts=status_counts, complete=complete, seconds_model=seconds_model,
        seconds_total=total, table=table,
    )


def attach_design(model: ImageModel, rows: list[dict[str, Any]]) -> bool:
    """Hand the plan rows ``rows`` to ``model`` if, and only if, it is a simulated model
    (:class:`~acrb.models.base.Simulated`); returns whether it did. An audited model must never
    see the labels it is audited on."""
    if not isinstance(model, Simulated):
        return False
    model.attach_design({str(row["request_id"]): RequestRecord.model_validate(row)
                         for row in rows})
    return True


def edit_request(row: dict[str, Any], source_image: np.ndarray,
                 extra_images: tuple[np.ndarray, ...] = ()) -> EditRequest:
    """The request an editor gets for the plan row ``row``: id, instruction, seed, images."""
    return EditRequest(request_id=str(row["request_id"]), instruction=str(row["prompt_text"]),
                       seed=int(row["seed"]), source_image=source_image,
                       extra_images=extra_images)


def generation_request(row: dict[str, Any]) -> GenerationRequest:
    """The request a generator gets for the plan row ``row``: id, prompt, seed."""
    return GenerationRequest(request_id=str(row["request_id"]), prompt=str(row["prompt_text"]),
                             seed=int(row["seed"]))


def extra_sources(row: dict[str, Any]) -> list[dict[str, str]]:
    """The further portraits of the plan row ``row`` ({source_id, path, sha256}, in order)."""
    text = row.get("extra_sources") or ""
    return list(json.loads(text)) if text else []


def model_requests(model: ImageModel, load_source: Callable[[str, str], np.ndarray],
                   batch: list[dict[str, Any]]) -> list[EditRequest] | list[GenerationRequest]:
    """The requests ``model`` gets for the plan rows ``batch``: an editor's carry the source
    images (loaded and checked against the plan's sha256), a generator's the prompt alone."""
    if isinstance(model, Editor):
        return [
            edit_request(row, load_source(row["source_path"], row["source_sha256"]),
                         tuple(load_source(o["path"], o["sha256"]) for o in extra_sources(row)))
            for row in batch
        ]
    if isinstance(model, Generator):
        return [generation_request(row) for row in batch]
    raise TypeError(f"{type(model).__name__} is neither an Editor nor a Generator")


def call_model(model: ImageModel, requests: list[EditRequest] | list[GenerationRequest]
               ) -> list[Outcome]:
    """The outcomes of ``model`` for ``requests`` (built by :func:`model_requests`)."""
    if isinstance(model, Editor):
        return model.edit(cast(list[EditRequest], requests))
    return cast(Generator, model).generate(cast(list[GenerationRequest], requests))


def _upgrade_records(store: RecordStore[GenerationRecord], timings_log: Path) -> None:
    """Rewrite the per-request files of an older ACRB written before version 4 without their
    timings, which are logged first (:func:`acrb.records.upgrade_records`); the store then
    folds them into its records file, so the folder DVC hashes is what a fresh run writes."""
    def log_dropped(stored: dict[Path, dict[str, Any]]) -> None:
        append_timings(timings_log, [
            RequestTiming(request_id=str(row.get("request_id", path.stem)), stage="generate",
                          model=str(row.get("model", "")), status=str(row.get("status", "")),
                          seconds=row.get("seconds"),
                          finished_at=str(row.get("created_at") or ""),
                          peak_gpu_memory_mb=row.get("peak_gpu_memory_mb"), shard="",
                          origin="migrated")
            for path, row in sorted(stored.items())
        ])

    upgrade_records(store.legacy_paths(), GenerationRecord, keep=log_dropped)


def load_model(entry: ModelEntry) -> ImageModel:
    """Build and load the model of ``entry``; a failure to load is an AcrbError naming it."""
    model = entry.build()
    try:
        model.load()
    except AcrbError:
        raise
    except Exception as exc:
        raise AcrbError(
            f"model {entry.key!r} could not be loaded: {type(exc).__name__}: {exc}",
            "check models.<name>.config and that the weights are downloaded or the service is "
            "reachable (docs/models.md); nothing was generated",
        ) from exc
    return model


class GenerateWorker:
    """Runs one model over batches of plan rows, writing each request's image and record: what
    the local runner runs in the stage's process and what each Ray actor holds
    (:mod:`acrb.runners`), so both write the same records.

    Built once (the model is loaded then); called with a batch, it skips the rows whose record
    is already finished (on a batch retried after a lost actor, those it wrote before), runs the
    model on the rest, writes their records, logs their timings, and returns each row's
    (status, model seconds): (``done``, 0) for a skipped row.

    With ``overlap`` (the local runner), a batch's images and records are written by a
    :class:`BatchWriter` while the model runs the next batch, and :meth:`prepare` loads the
    next batch's sources ahead; :meth:`close` drains the writer and raises its failures. A Ray
    actor writes before it returns, so a batch it reports is on disk when its actor is lost.
    """

    def __init__(self, ctx: StageContext, entry: ModelEntry, store: RecordStore[GenerationRecord],
                 images_dir: Path, timings_log: Path, shard: str, overlap: bool = False) -> None:
        self.ctx, self.entry = ctx, entry
        self.store, self.images_dir = store, images_dir
        # What earlier workers of this run wrote (a batch is retried after a lost actor), then
        # what this one writes: the stage left out what was finished before it started.
        self.written: dict[str, GenerationRecord] = store.load(journals_only=True)
        self.timings_log, self.shard = timings_log, shard
        self.model = load_model(entry)
        self.versions = canonical_json({"acrb": __version__,
                                        "python": platform.python_version(),
                                        **self.model.library_versions()})
        self.where = here()  # host, GPU, process: the same for every request of this worker
        self.load_source = _source_loader(ctx)
        self.writer = BatchWriter() if overlap else None

    def close(self) -> None:
        """Finish the writes in flight (raising their failure) and stop the helper threads;
        the model goes with the process."""
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self.load_source.close()

    def prepare(self, batch: list[dict[str, Any]]) -> None:
        """Start loading the sources of ``batch``, the one after the batch about to run."""
        if isinstance(self.model, Editor):
            for row in batch:
                self.load_source.prefetch(row["source_path"], row["source_sha256"])
                for other in extra_sources(row):
                    self.load_source.prefetch(other["path"], other["sha256"])

    def __call__(self, batch: list[dict[str, Any]]) -> list[tuple[str, float]]:
        cfg = self.ctx.params.generate
        ids = [str(row["request_id"]) for row in batch]
        finished = read_finished(self.written, self.ctx.root, ids, cfg.verify_existing,
                                 cfg.retry_errors, self.model.output_version)
        todo = [row for row in batch if str(row["request_id"]) not in finished]
        statuses = dict.fromkeys(ids, ("done", 0.0))
        if todo:
            statuses.update(self._run(todo))
        return [statuses[i] for i in ids]

    def _run(self, batch: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
        model = self.model
        attach_design(model, batch)
        requests = model_requests(model, self.load_source, batch)
        tick = time.perf_counter()
        try:
            outcomes = call_model(model, requests)
            if len(outcomes) != len(batch):
                raise RuntimeError(f"adapter returned {len(outcomes)} outcomes for "
                                   f"{len(batch)} requests")
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            tqdm.write(f"generate {self.entry.key}: batch failed: {message}", file=sys.stderr)
            outcomes = [Outcome(status="error", message=message)] * len(batch)
        elapsed = time.perf_counter() - tick
        finished_at = utc_now()
        outcomes = [settled(outcome) for outcome in outcomes]
        statuses: dict[str, tuple[str, float]] = {
            str(row["request_id"]): (str(outcome.status), round(
                outcome.seconds if outcome.seconds is not None else elapsed / len(batch), 6))
            for row, outcome in zip(batch, outcomes, strict=True)
        }
        write = partial(self._write, batch, outcomes, statuses, finished_at)
        if self.writer is None:
            write()
        else:
            self.writer.submit(write)
        return statuses

    def _write(self, batch: list[dict[str, Any]], outcomes: list[Outcome],
               statuses: dict[str, tuple[str, float]], finished_at: str) -> None:
        """Write the images of one batch (encoded in parallel), then its records, then its
        timings: a request is recorded once its image is there, and logged once recorded."""
        revision = self.model.revision
        futures = [_encoder().submit(_write_outcome, self.ctx, row["request_id"], outcome,
                                     self.images_dir, revision, self.versions,
                                     model=row["model"], output_version=self.model.output_version)
                   for row, outcome in zip(batch, outcomes, strict=True)]
        # Every image of the batch finishes (or fails and removes its temporary file) before a
        # failure is raised, so nothing is still being written when the stage stops.
        wait(futures)
        records = [future.result() for future in futures]
        timings = [
            measured(self.where, request_id=row["request_id"], stage="generate",
                     model=row["model"], status=record.status,
                     seconds=statuses[str(row["request_id"])][1], batch_size=len(batch),
                     finished_at=finished_at, peak_gpu_memory_mb=outcome.peak_gpu_memory_mb,
                     shard=self.shard)
            for row, outcome, record in zip(batch, outcomes, records, strict=True)
        ]
        self.store.append(records)
        self.written.update((r.request_id, r) for r in records)
        append_timings(self.timings_log, timings)


#: The plan columns a worker needs to build an audited model's requests and write their
#: records: no source group, prompt attribute or category among them.
REQUEST_COLUMNS = ("request_id", "model", "prompt_text", "seed", "source_path", "source_sha256",
                   "extra_sources")


def worker_rows(pending: pd.DataFrame, simulated: bool) -> list[dict[str, Any]]:
    """The plan rows of ``pending`` as the worker (in this process or a Ray actor) gets them:
    whole for a simulated model, whose planted behaviour reads the design
    (:func:`attach_design`), and only :data:`REQUEST_COLUMNS` for any other, so that neither a
    Ray actor nor the model it holds ever receives the race, gender or age it is audited on."""
    columns = list(pending.columns) if simulated else [
        c for c in REQUEST_COLUMNS if c in pending.columns]
    return cast(list[dict[str, Any]], pending[columns].to_dict(orient="records"))


def _generate(ctx: StageContext, entry: ModelEntry, pending: pd.DataFrame,
              store: RecordStore[GenerationRecord], images_dir: Path, batch_size: int,
              timings_log: Path, shard: str) -> float:
    """Run the model over ``pending`` in batches of ``batch_size`` on the runner of params
    ``generate.runner``; returns the model seconds of its requests (summed over workers)."""
    rows = worker_rows(pending, simulated=entry.model_class().simulated)
    batches = [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]
    # Writes overlap the next batch in this process; a Ray actor writes before it answers.
    make_worker = partial(GenerateWorker, ctx, entry, store, images_dir, timings_log, shard,
                          overlap=ctx.params.generate.runner == "local")
    seconds = 0.0
    for results in run_batches(ctx.params.generate.runner, make_worker, batches,
                               ray_params=ctx.params.ray, desc=f"generate {entry.key}"):
        seconds += sum(s for _, s in results)
    return seconds


def settled(outcome: Outcome) -> Outcome:
    """``outcome`` as it will be recorded: an ``ok`` without an image is an error."""
    if outcome.status == "ok" and outcome.image is None:
        return Outcome(status="error", message="adapter returned ok without an image",
                       seconds=outcome.seconds, peak_gpu_memory_mb=outcome.peak_gpu_memory_mb)
    return outcome


def _write_outcome(ctx: StageContext, request_id: str, outcome: Outcome, images_dir: Path,
                   revision: str, versions: str, model: str,
                   output_version: int | None = None) -> GenerationRecord:
    """Write the image (if any) of one request and return its record (to be stored)."""
    image_path = image_sha = None
    outcome = settled(outcome)
    if outcome.status == "ok" and outcome.image is not None:
        path = images_dir / f"{request_id}.png"
        image_sha = write_png(path, np.ascontiguousarray(outcome.image, dtype=np.uint8))
        image_path = str(path.relative_to(ctx.root))
    record = GenerationRecord(
        request_id=request_id, model=model, status=outcome.status,
        refusal_kind=outcome.refusal_kind, message=outcome.message[:2000],
        image_path=image_path, image_sha256=image_sha,
        model_revision=revision, library_versions=versions,
        refusal_code=outcome.refusal_code, cost_usd=outcome.cost_usd,
        output_version=output_version,
    )
    return record
