"""Records evolve by migration: a finished request is never redone because its record's schema
changed, and a record this ACRB cannot read stops the stage instead of being silently redone."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from acrb import layout
from acrb.errors import InputDataError
from acrb.journal import JOURNAL_DIR, LEGACY_DIR, RECORDS_FILE, RecordStore
from acrb.records import (
    GENERATION_RUN_FIELDS,
    MIGRATIONS,
    RECORD_VERSION_FIELD,
    GenerationRecord,
    JudgementRecord,
    Record,
    read_table,
    write_record,
)
from acrb.stages import evaluate, generate, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.timings import RequestTiming, append_timings, read_timings, timings_path
from tests.conftest import write_params

MODEL = "synthetic-fair"


GEN_NOW = GenerationRecord.version
JUDGE_NOW = JudgementRecord.version


class GenerationRecordV3(GenerationRecord):
    """The generation record as a later ACRB might write it: one field more."""

    version: ClassVar[int] = GEN_NOW + 1
    device: str


class JudgementRecordV3(JudgementRecord):
    """The judgement record as a later ACRB might write it: one field more."""

    version: ClassVar[int] = JUDGE_NOW + 1
    detector_suite: str


@pytest.fixture(scope="module", autouse=True)
def _no_output_version() -> Iterator[None]:
    """The simulated editor here as an adapter without an output version, so that only a
    record's schema decides whether it is reused (an output version of its own would make
    again the records of an older one: tests/test_pipeline.py checks that)."""
    from acrb.models.synthetic import SyntheticEditor

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SyntheticEditor, "output_version", None)
        yield


@pytest.fixture(scope="module")
def finished_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny project with every request of MODEL generated and judged (built once)."""
    root = tmp_path_factory.mktemp("finished") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        ctx = StageContext.load(root / "params.yaml", root)
        sources.run(ctx)
        prompts.run(ctx)
        plan.run(ctx)
        generate.run(ctx, MODEL)
        evaluate.run(ctx, MODEL)
    yield root


@pytest.fixture
def ctx(finished_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StageContext:
    """A private copy of the finished project, so each test may damage its records."""
    root = tmp_path / "project"
    shutil.copytree(finished_project, root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    return StageContext.load(root / "params.yaml", root)


#: How an output keeps its records: the lines of ``records.jsonl`` (this ACRB), or a folder of
#: per-request files ``records/<request_id>.json`` (an older ACRB), read and folded in.
STORED_AS = ["jsonl", "legacy"]


class Stored:
    """The records of one output folder as they lie on disk, to read and damage in a test:
    item ``n`` is the ``n``-th request by id, a line of ``records.jsonl`` or a legacy file."""

    def __init__(self, folder: Path, record_type: type[Record]) -> None:
        self.folder, self.record_type = folder, record_type
        self.file = folder / RECORDS_FILE
        self.legacy = folder / LEGACY_DIR

    def as_legacy(self) -> Stored:
        """Rewrite the output as an older ACRB left it: a file per request, no records.jsonl."""
        for request_id, record in RecordStore(self.folder, self.record_type).load().items():
            write_record(self.legacy / f"{request_id}.json", record)
        self.file.unlink()
        return self

    def is_legacy(self) -> bool:
        return self.legacy.is_dir()

    def _paths(self) -> list[Path]:
        return sorted(self.legacy.glob("*.json"))

    def names(self) -> list[str]:
        """What an error names each record by: its file, or records.jsonl and the line."""
        if self.is_legacy():
            return [str(path) for path in self._paths()]
        return [f"{self.file}:{n}" for n in range(1, len(self.rows()) + 1)]

    def rows(self) -> list[dict[str, Any]]:
        if self.is_legacy():
            return [json.loads(path.read_text()) for path in self._paths()]
        return [json.loads(line) for line in self.file.read_text().splitlines()]

    def request_ids(self) -> list[str]:
        return [str(row["request_id"]) for row in self.rows()]

    def rewrite(self, n: int, change: Any) -> None:
        """Apply ``change`` (which edits a dict in place) to the ``n``-th record."""
        if self.is_legacy():
            rewrite(self._paths()[n], change)
            return
        lines = self.file.read_text().splitlines()
        data = json.loads(lines[n])
        change(data)
        lines[n] = json.dumps(data)
        self.file.write_text("".join(line + "\n" for line in lines))

    def remove(self, n: int) -> str:
        """Delete the ``n``-th record (as a user deletes one to redo it); returns its id."""
        request_id = self.request_ids()[n]
        if self.is_legacy():
            self._paths()[n].unlink()
        else:
            lines = self.file.read_text().splitlines()
            self.file.write_text("".join(line + "\n" for i, line in enumerate(lines) if i != n))
        return request_id


def generations(ctx: StageContext, stored_as: str = "jsonl") -> Stored:
    stored = Stored(ctx.path(layout.generations_dir(MODEL)), GenerationRecord)
    return stored.as_legacy() if stored_as == "legacy" else stored


def judgements(ctx: StageContext, stored_as: str = "jsonl") -> Stored:
    stored = Stored(ctx.path(layout.judgements_dir(MODEL)), JudgementRecord)
    return stored.as_legacy() if stored_as == "legacy" else stored


def folded(stored: Stored) -> None:
    """The output holds records.jsonl alone: no older folder, no journal."""
    assert stored.file.is_file()
    assert not stored.legacy.exists() and not (stored.folder / JOURNAL_DIR).exists()


def snapshot(ctx: StageContext) -> dict[Path, tuple[bytes, int]]:
    """Bytes and modification time of every file the generate and evaluate stages own."""
    files = {}
    for folder in (layout.generations_dir(MODEL), layout.judgements_dir(MODEL)):
        for path in ctx.path(folder).rglob("*"):
            if path.is_file():
                files[path] = (path.read_bytes(), path.stat().st_mtime_ns)
    return files


def rewrite(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def use_generation_v3(monkeypatch: pytest.MonkeyPatch) -> None:
    for stage in (generate, evaluate):
        monkeypatch.setattr(stage, "GenerationRecord", GenerationRecordV3)


def test_records_are_stamped_with_table_and_version(ctx: StageContext) -> None:
    for stored, table, version in ((generations(ctx), "generation", GEN_NOW),
                                   (judgements(ctx), "judgement", JUDGE_NOW)):
        rows = stored.rows()
        assert len(rows) == 400
        assert {(row["acrb_table"], row[RECORD_VERSION_FIELD]) for row in rows} == {
            (table, version)}


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_generation_records_of_the_previous_version_are_migrated_not_redone(
        ctx: StageContext, monkeypatch: pytest.MonkeyPatch, stored_as: str) -> None:
    stored = generations(ctx, stored_as)
    before = snapshot(ctx)
    use_generation_v3(monkeypatch)
    monkeypatch.setitem(MIGRATIONS, ("generation", GEN_NOW),
                        lambda row: {**row, "device": "cpu:old"})
    summary = generate.run(ctx, MODEL)
    assert summary.generated == 0 and summary.skipped == summary.planned == 400
    table = read_table(ctx.path(layout.generations_table(MODEL)), GenerationRecordV3)
    assert (table["device"] == "cpu:old").all() and len(table) == 400
    # The images stay as they were; the records are rewritten as the new version (the bytes a
    # fresh run writes, so that dvc.lock does not tell an upgraded project from a fresh one).
    after = snapshot(ctx)
    records = {ctx.path(layout.generations_table(MODEL)), stored.file,
               *(p for p in before if p.parent == stored.legacy)}
    assert {p: v for p, v in after.items() if p not in records} == \
        {p: v for p, v in before.items() if p not in records}
    folded(stored)
    rows = stored.rows()
    assert len(rows) == 400
    assert all(row[RECORD_VERSION_FIELD] == GEN_NOW + 1 and row["device"] == "cpu:old"
               for row in rows)
    # The judgements are reused too: the migrated generations still name the same outputs.
    assert evaluate.run(ctx, MODEL).judged == 0


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_judgement_records_of_the_previous_version_are_migrated_not_rejudged(
        ctx: StageContext, monkeypatch: pytest.MonkeyPatch, stored_as: str) -> None:
    stored = judgements(ctx, stored_as)
    monkeypatch.setattr(evaluate, "JudgementRecord", JudgementRecordV3)
    monkeypatch.setitem(MIGRATIONS, ("judgement", JUDGE_NOW),
                        lambda row: {**row, "detector_suite": "pixels"})
    summary = evaluate.run(ctx, MODEL)
    assert summary.judged == 0 and summary.reused == 400
    table = read_table(ctx.path(layout.judgements_table(MODEL)), JudgementRecordV3)
    assert (table["detector_suite"] == "pixels").all() and len(table) == 400
    folded(stored)
    assert [(row[RECORD_VERSION_FIELD], row["detector_suite"]) for row in stored.rows()] == \
        [(JUDGE_NOW + 1, "pixels")] * 400


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_records_written_before_stamps_are_read_as_version_2(ctx: StageContext,
                                                             stored_as: str) -> None:
    outputs = [generations(ctx, stored_as), judgements(ctx, stored_as)]
    for stored in outputs:
        for n in range(400):
            stored.rewrite(n, lambda data: (data.pop("acrb_table"),
                                            data.pop(RECORD_VERSION_FIELD)))
    assert generate.run(ctx, MODEL).generated == 0
    assert evaluate.run(ctx, MODEL).judged == 0
    for stored, version in zip(outputs, (GEN_NOW, JUDGE_NOW), strict=True):
        folded(stored)
        assert {row[RECORD_VERSION_FIELD] for row in stored.rows()} == {version}


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_a_version_bump_without_migration_stops_generate(
        ctx: StageContext, monkeypatch: pytest.MonkeyPatch, stored_as: str) -> None:
    stored = generations(ctx, stored_as)
    before = snapshot(ctx)
    use_generation_v3(monkeypatch)
    with pytest.raises(InputDataError) as err:
        generate.run(ctx, MODEL)
    message = str(err.value)
    assert f"400 generation record(s) cannot be read as version {GEN_NOW + 1}" in message
    assert stored.names()[0] + " (" in message and "and 397 more" in message
    assert f"no migration from version {GEN_NOW}" in message
    assert "add a migration" in message and "MIGRATIONS in acrb/records.py" in message
    assert snapshot(ctx) == before


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_a_generation_record_of_a_future_version_stops_generate(ctx: StageContext,
                                                                stored_as: str) -> None:
    stored = generations(ctx, stored_as)
    stored.rewrite(7, lambda data: data.update({RECORD_VERSION_FIELD: GEN_NOW + 1,
                                                "device": "gpu"}))
    future = stored.names()[7]
    before = snapshot(ctx)
    with pytest.raises(InputDataError) as err:
        generate.run(ctx, MODEL)
    message = str(err.value)
    assert f"1 generation record(s) cannot be read as version {GEN_NOW}: {future} (" in message
    assert f"newer than the {GEN_NOW} this ACRB reads" in message and "upgrade ACRB" in message
    assert snapshot(ctx) == before


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_an_invalid_generation_record_stops_generate(ctx: StageContext, stored_as: str) -> None:
    stored = generations(ctx, stored_as)
    stored.rewrite(3, lambda data: data.pop("model_revision"))
    broken = stored.names()[3]
    before = snapshot(ctx)
    with pytest.raises(InputDataError) as err:
        generate.run(ctx, MODEL)
    message = str(err.value)
    assert f"1 generation record(s) cannot be read as version {GEN_NOW}: {broken} (" in message
    assert "field 'model_revision'" in message
    assert "delete those" in message and "to redo their requests" in message
    assert snapshot(ctx) == before


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_a_judgement_record_of_a_future_version_stops_evaluate(ctx: StageContext,
                                                               stored_as: str) -> None:
    stored = judgements(ctx, stored_as)
    stored.rewrite(5, lambda data: data.update({RECORD_VERSION_FIELD: JUDGE_NOW + 1}))
    future = stored.names()[5]
    before = snapshot(ctx)
    with pytest.raises(InputDataError) as err:
        evaluate.run(ctx, MODEL)
    message = str(err.value)
    assert f"1 judgement record(s) cannot be read as version {JUDGE_NOW}: {future} (" in message
    assert "upgrade ACRB" in message
    assert snapshot(ctx) == before


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_an_invalid_judgement_record_stops_evaluate(ctx: StageContext, stored_as: str) -> None:
    stored = judgements(ctx, stored_as)
    for n in (0, 1):
        stored.rewrite(n, lambda data: data.update({"status": "maybe"}))
    broken = stored.names()[:2]
    before = snapshot(ctx)
    with pytest.raises(InputDataError) as err:
        evaluate.run(ctx, MODEL)
    message = str(err.value)
    assert "2 judgement record(s)" in message and all(name + " (" in message for name in broken)
    assert "field 'status'" in message and "add a migration" in message
    assert snapshot(ctx) == before


@pytest.mark.parametrize("stored_as", STORED_AS)
def test_redo_reasons_are_unchanged(ctx: StageContext, stored_as: str) -> None:
    """Missing records and changed detector settings still mean "do it (again)"."""
    generation, judgement = generations(ctx, stored_as), judgements(ctx, stored_as)
    removed = generation.remove(0)
    judgement.remove(0)
    assert generate.run(ctx, MODEL).generated == 1
    assert evaluate.run(ctx, MODEL).judged == 1
    for stored in (generation, judgement):
        folded(stored)
        assert len(stored.rows()) == 400 and removed in stored.request_ids()
    write_params(ctx.root, {"evaluate": {"thresholds": {"lightening_ita_min": 7.0}}})
    changed = StageContext.load(ctx.root / "params.yaml", ctx.root)
    assert evaluate.run(changed, MODEL).judged == 400


# ---- version 4 of a generation: the run's measurements leave the record ----------------------


def test_generate_logs_each_request_s_timing_beside_its_outputs(ctx: StageContext) -> None:
    timings = read_timings(timings_path(ctx.root, "generate", MODEL))
    assert sorted(t.request_id for t in timings) == generations(ctx).request_ids()
    assert len(timings) == 400
    assert {t.origin for t in timings} == {"measured"} and {t.shard for t in timings} == {"all"}
    assert all(t.seconds is not None and t.seconds >= 0 and t.host and t.finished_at
               and t.batch_size for t in timings)
    # No record carries a measurement of the run.
    assert not any(GENERATION_RUN_FIELDS & set(row) for row in generations(ctx).rows())


def test_a_rerun_from_scratch_writes_the_same_generation_bytes(ctx: StageContext) -> None:
    folder = ctx.path(layout.generations_dir(MODEL))
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert Path(RECORDS_FILE) in before
    shutil.rmtree(folder)
    assert generate.run(ctx, MODEL).generated == 400
    after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert after.keys() == before.keys()
    assert [p for p in after if after[p] != before[p]] == []


def test_version_3_generation_records_are_rewritten_and_their_timings_logged(
        ctx: StageContext) -> None:
    """Version 3 is older than the records file: its records lie in an older ACRB's folder."""
    fresh = generations(ctx).file.read_bytes()
    stored = generations(ctx, "legacy")
    ids = stored.request_ids()[:5]
    for n in range(5):
        stored.rewrite(n, lambda data, n=n: data.update({
            RECORD_VERSION_FIELD: 3, "seconds": 0.25 + n,
            "created_at": f"2025-01-0{n + 1}T00:00:00+00:00",
            "peak_gpu_memory_mb": 1024.0 if n == 0 else None}))
    log = timings_path(ctx.root, "generate", MODEL)
    logged_before = len(read_timings(log))
    summary = generate.run(ctx, MODEL)
    assert summary.generated == 0 and summary.skipped == 400
    # Each record is now what a fresh run writes, byte for byte.
    folded(stored)
    assert stored.file.read_bytes() == fresh
    migrated = [t for t in read_timings(log)[logged_before:] if t.origin == "migrated"]
    assert [(t.request_id, t.seconds, t.finished_at, t.peak_gpu_memory_mb) for t in migrated] == [
        (request_id, 0.25 + n, f"2025-01-0{n + 1}T00:00:00+00:00", 1024.0 if n == 0 else None)
        for n, request_id in enumerate(ids)]
    # A second run finds nothing left to upgrade.
    generate.run(ctx, MODEL)
    assert len([t for t in read_timings(log) if t.origin == "migrated"]) == 5


def test_a_version_3_record_that_cannot_migrate_leaves_every_record_as_it_was(
        ctx: StageContext) -> None:
    stored = generations(ctx, "legacy")
    for n in range(3):
        stored.rewrite(n, lambda data: data.update({RECORD_VERSION_FIELD: 3, "seconds": 1.0,
                                                    "created_at": "then"}))
    stored.rewrite(1, lambda data: data.pop("model_revision"))
    before = snapshot(ctx)
    with pytest.raises(InputDataError, match="1 generation record"):
        generate.run(ctx, MODEL)
    assert snapshot(ctx) == before
    assert not timings_path(ctx.root, "generate", MODEL).read_text().count('"migrated"')


def test_timing_log_skips_a_torn_last_line(tmp_path: Path) -> None:
    log = tmp_path / "t.jsonl"
    timing = RequestTiming(request_id="r", stage="generate", model="m", status="ok",
                           seconds=1.5, finished_at="now")
    append_timings(log, [timing, timing.model_copy(update={"request_id": "s"})])
    with log.open("a") as handle:
        handle.write('{"request_id": "t", "sta')  # killed mid-write
    assert [t.request_id for t in read_timings(log)] == ["r", "s"]
    assert read_timings(tmp_path / "absent.jsonl") == []
