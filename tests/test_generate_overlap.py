"""The generate stage keeps a model busy: a batch's images and records are written while the
next batch runs, and the next batch's sources are loaded ahead. What must still hold: every
record describes a complete image, a failed write stops the stage with its error, nothing is
left unwritten when the stage returns, and a Ray actor's batch is on disk when it answers."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from acrb import layout
from acrb.config import RayParams
from acrb.errors import InputDataError
from acrb.journal import RecordStore
from acrb.records import GenerationRecord, read_table
from acrb.runners import run_batches
from acrb.stages import generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.storage import sha256_file
from acrb.timings import timings_path

MODEL = "synthetic-biased"


def _planned(project: Path, batch_size: int = 8) -> StageContext:
    from tests.conftest import update_params

    ctx = update_params(project, lambda p: (p.update(models={MODEL: p["models"][MODEL]}),
                                            p["generate"].update(batch_size=batch_size)))
    for stage in (sources, prompts, plan):
        stage.run(ctx)
    return ctx


def test_a_failed_write_stops_the_stage_and_a_rerun_finishes(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _planned(project)
    real = generate.write_png
    calls = {"n": 0}

    def full_disk(path: Path, pixels: np.ndarray) -> str:
        calls["n"] += 1
        if calls["n"] > 40:
            raise OSError(28, "No space left on device")
        return real(path, pixels)

    monkeypatch.setattr(generate, "write_png", full_disk)
    with pytest.raises(OSError, match="No space left"):
        generate.run(ctx, MODEL)
    store = RecordStore(ctx.path(layout.generations_dir(MODEL)), GenerationRecord)
    stored = store.load(journals_only=True)
    # The batches written before the failure are stored whole; the failing one is not.
    assert 0 < len(stored) <= 40 and len(stored) % 8 == 0
    for record in stored.values():
        if record.image_path:
            assert sha256_file(ctx.path(record.image_path)) == record.image_sha256

    monkeypatch.setattr(generate, "write_png", real)
    summary = generate.run(ctx, MODEL)
    assert summary.complete and summary.skipped == len(stored)
    table = read_table(ctx.path(layout.generations_table(MODEL)), GenerationRecord)
    assert len(table) == summary.planned and table["request_id"].is_unique


def test_every_record_and_timing_is_written_when_the_stage_returns(project: Path) -> None:
    ctx = _planned(project, batch_size=16)
    summary = generate.run(ctx, MODEL)
    assert summary.complete and summary.generated == summary.planned
    table = read_table(ctx.path(layout.generations_table(MODEL)), GenerationRecord)
    ok = table[table["status"] == "ok"]
    assert len(table) == summary.planned
    for path, digest in zip(ok["image_path"], ok["image_sha256"], strict=True):
        assert sha256_file(ctx.path(path)) == digest
    log = timings_path(project, "generate", MODEL).read_text().splitlines()
    assert len(log) == summary.planned


def _worker(ctx: StageContext, overlap: bool) -> generate.GenerateWorker:
    out = ctx.path(layout.generations_dir(MODEL))
    (out / "images").mkdir(parents=True, exist_ok=True)
    store = RecordStore(out, GenerationRecord)
    return generate.GenerateWorker(ctx, ctx.params.model(MODEL), store, out / "images",
                                   timings_path(ctx.root, "generate", MODEL), "all",
                                   overlap=overlap)


def _rows(ctx: StageContext, count: int) -> list[dict[str, Any]]:
    requests = ctx.model_requests(MODEL)
    return generate.worker_rows(requests.head(count), simulated=True)


def test_a_worker_without_overlap_has_written_its_batch_when_it_answers(project: Path) -> None:
    """What a Ray actor runs: a batch it reports is on disk, for the retry after a lost actor."""
    ctx = _planned(project)
    worker = _worker(ctx, overlap=False)
    rows = _rows(ctx, 5)
    statuses = worker(rows)
    assert [s for s, _ in statuses] != ["done"] * 5
    stored = RecordStore(ctx.path(layout.generations_dir(MODEL)),
                         GenerationRecord).load(journals_only=True)
    assert set(stored) == {str(r["request_id"]) for r in rows}
    worker.close()


def test_an_overlapping_worker_writes_by_close_and_answers_the_same(project: Path) -> None:
    ctx = _planned(project)
    worker = _worker(ctx, overlap=True)
    rows = _rows(ctx, 12)
    first = worker(rows[:6])
    second = worker(rows[6:])
    worker.close()
    stored = RecordStore(ctx.path(layout.generations_dir(MODEL)),
                         GenerationRecord).load(journals_only=True)
    assert set(stored) == {str(r["request_id"]) for r in rows}
    assert [s for s, _ in first + second] == [stored[str(r["request_id"])].status for r in rows]


def test_the_batch_writer_is_bounded_and_raises_a_failure_at_the_next_submit() -> None:
    writer = generate.BatchWriter(depth=1)
    release = threading.Event()
    started = threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)

    writer.submit(slow)
    started.wait(5)
    blocked = threading.Thread(target=writer.submit, args=(lambda: None,))
    blocked.start()
    time.sleep(0.2)
    assert blocked.is_alive(), "a second batch must wait while the first is written"
    release.set()
    blocked.join(5)
    assert not blocked.is_alive()

    def broken() -> None:
        raise OSError("disk full")

    writer.submit(broken)
    with pytest.raises(OSError, match="disk full"):
        writer.submit(lambda: None)
    writer.submit(broken)
    with pytest.raises(OSError, match="disk full"):
        writer.close()


def test_a_changed_source_fails_when_used_not_when_prefetched(project: Path) -> None:
    ctx = _planned(project)
    row = _rows(ctx, 1)[0]
    path = ctx.path(row["source_path"])
    path.write_bytes(path.read_bytes() + b"\0")
    loader = generate.SourceLoader(ctx)
    loader.prefetch(row["source_path"], row["source_sha256"])  # must not raise here
    with pytest.raises(InputDataError, match="changed since the plan was made"):
        loader(row["source_path"], row["source_sha256"])
    loader.close()


def test_the_local_runner_prepares_the_next_batch_before_running_this_one() -> None:
    events: list[tuple[str, int]] = []

    class Worker:
        def prepare(self, batch: list[int]) -> None:
            events.append(("prepare", batch[0]))

        def __call__(self, batch: list[int]) -> list[int]:
            events.append(("run", batch[0]))
            return batch

        def close(self) -> None:
            events.append(("close", -1))

    batches = [[0, 1], [2, 3], [4]]
    results = list(run_batches("local", Worker, batches, ray_params=RayParams(), desc="t"))
    assert results == batches
    assert events == [("prepare", 2), ("run", 0), ("prepare", 4), ("run", 2), ("run", 4),
                      ("close", -1)]
