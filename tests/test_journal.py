"""The per-output record store (:class:`acrb.journal.RecordStore`): journals appended while a
stage runs, folded into one sorted ``records.jsonl`` by ``finish()``; a torn last line dropped,
any other unreadable line named by file and line; older per-request folders folded in; and, on
a tiny project, the outputs of generate, evaluate and judge as the stages leave them."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb import layout
from acrb.errors import InputDataError
from acrb.journal import JOURNAL_DIR, LEGACY_DIR, RECORDS_FILE, RecordStore
from acrb.records import (
    RECORD_VERSION_FIELD,
    GenerationRecord,
    JudgementRecord,
    ScoreRecord,
    record_line,
    write_record,
)
from acrb.stages import evaluate, generate, judge
from acrb.stages.context import StageContext
from tests.conftest import one_model_project

GEN_NOW = GenerationRecord.version


def generation(request_id: str, message: str = "") -> GenerationRecord:
    return GenerationRecord(request_id=request_id, model="m", status="ok", message=message,
                            image_path=f"images/{request_id}.png", image_sha256="ab" * 32,
                            model_revision="r1", library_versions="{}")


def store_in(folder: Path) -> RecordStore[GenerationRecord]:
    return RecordStore(folder, GenerationRecord)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def expected_bytes(records: list[GenerationRecord]) -> bytes:
    """What ``records.jsonl`` holds for ``records``: one stamped line each, by request id."""
    ordered = sorted(records, key=lambda r: r.request_id)
    return "".join(record_line(r) + "\n" for r in ordered).encode("utf-8")


# ---- append, load, later lines ------------------------------------------------------------

def test_appended_records_are_loaded_by_request_id(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    records = [generation(f"r{i}") for i in range(5)]
    store.append(records[:2])
    store.append(records[2:])
    store.append([])  # nothing to write: no empty journal either
    assert store.load() == {r.request_id: r for r in records}
    assert len(store.journals()) == 1 and len(lines(store.journals()[0])) == 5
    assert not store.records_file.exists()  # nothing is compacted before finish()
    # Another store on the folder (a later run) reads them back.
    assert store_in(tmp_path).load() == {r.request_id: r for r in records}


def test_a_later_line_for_the_same_request_wins(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    store.append([generation("a", "first"), generation("b")])
    store.append([generation("a", "second")])
    assert store.load()["a"].message == "second"
    # A journal line also wins over the compacted file, and finish() keeps one line per request.
    store.finish()
    store.append([generation("b", "redone")])
    assert store.load()["b"].message == "redone"
    store.finish()
    assert store.records_file.read_bytes() == expected_bytes(
        [generation("a", "second"), generation("b", "redone")])


def test_load_journals_only_reads_what_was_stored_since_the_last_finish(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    store.append([generation("a"), generation("b")])
    store.finish()
    write_record(store.legacy_dir / "c.json", generation("c"))
    store.append([generation("d"), generation("b", "redone")])
    assert store.load(journals_only=True) == {"d": generation("d"),
                                              "b": generation("b", "redone")}
    assert sorted(store.load()) == ["a", "b", "c", "d"]
    # The compacted file is not read at all: a line there that cannot be read is not reported.
    store.records_file.write_text("not json\n")
    assert sorted(store.load(journals_only=True)) == ["b", "d"]
    assert store_in(tmp_path / "empty").load(journals_only=True) == {}


# ---- a torn last line, and every other line that cannot be read ---------------------------

@pytest.mark.parametrize("cut", [1, 40, None], ids=["first-byte", "mid-line", "before-newline"])
def test_a_torn_last_line_of_a_journal_is_dropped(tmp_path: Path, cut: int | None) -> None:
    store = store_in(tmp_path)
    store.append([generation("a"), generation("b")])
    [journal] = store.journals()
    with journal.open("a", encoding="utf-8") as handle:  # killed while writing "c"
        handle.write(record_line(generation("c"))[:cut])
    assert sorted(store.load()) == ["a", "b"]
    assert sorted(store.load(journals_only=True)) == ["a", "b"]
    store.finish()
    assert store.records_file.read_bytes() == expected_bytes([generation("a"), generation("b")])
    assert not store.journal_dir.exists()


def test_a_records_file_without_its_last_newline_is_read_whole(tmp_path: Path) -> None:
    """Only a journal is torn by a kill: the compacted file is written atomically, so its last
    line is read even without a newline, and one cut short is an error, never dropped."""
    store = store_in(tmp_path)
    store.finish([generation("a"), generation("b")])
    store.records_file.write_bytes(store.records_file.read_bytes().rstrip(b"\n"))
    assert sorted(store.load()) == ["a", "b"]
    store.records_file.write_bytes(store.records_file.read_bytes()[:-5])
    with pytest.raises(InputDataError, match=rf"{RECORDS_FILE}:2 \(not JSON"):
        store.load()


def _other_table(line: str) -> str:
    return line.replace('"acrb_table":"generation"', '"acrb_table":"score"')


def _newer(line: str) -> str:
    return line.replace(f'"{RECORD_VERSION_FIELD}":{GEN_NOW}',
                        f'"{RECORD_VERSION_FIELD}":{GEN_NOW + 1}')


BAD_LINES = [
    pytest.param(lambda line: line[:30], "not JSON", "add a migration", id="cut-short"),
    pytest.param(lambda line: "[1, 2]", "not a JSON object", "add a migration", id="not-object"),
    pytest.param(_other_table, "holds a 'score' record, expected 'generation'",
                 "add a migration", id="other-table"),
    pytest.param(_newer, f"version {GEN_NOW + 1}, newer than the {GEN_NOW} this ACRB reads",
                 "upgrade ACRB", id="newer-version"),
    pytest.param(lambda line: line.replace('"status":"ok"', '"status":"maybe"'),
                 "field 'status'", "add a migration", id="invalid-field"),
    pytest.param(lambda line: "[" * 100_000 + "]" * 100_000, "nested too deeply",
                 "add a migration",
                 id="nested-too-deeply"),
    # A RecursionError inside json.loads whatever the recursion limit: found before parsing.
    pytest.param(lambda line: line.replace('"message":""', '"message":' + "[" * 200
                                           + "]" * 200), "nested too deeply (201 levels",
                 "to redo their requests", id="nested-in-a-field"),
    # Python's int() refuses more than 4,300 digits (a ValueError inside json.loads).
    pytest.param(lambda line: line.replace('"message":""', '"message":' + "9" * 5000),
                 "a number of 5,000 digits, more than the 4,300 Python reads",
                 "to redo their requests", id="huge-number"),
]


@pytest.mark.parametrize(("damage", "detail", "fix"), BAD_LINES)
@pytest.mark.parametrize("where", ["journal-middle", "journal-last", "records-file"])
def test_a_complete_line_that_cannot_be_read_names_its_file_and_line(
        tmp_path: Path, damage: Any, detail: str, fix: str, where: str) -> None:
    store = store_in(tmp_path)
    good = [record_line(generation(rid)) for rid in ("a", "b", "c")]
    bad = damage(record_line(generation("x")))
    if where == "journal-middle":
        path, number = tmp_path / JOURNAL_DIR / "1-a.jsonl", 2
        text = "\n".join([good[0], bad, *good[1:]]) + "\n"
    elif where == "journal-last":  # ends with its newline: complete, so not a torn line
        path, number = tmp_path / JOURNAL_DIR / "1-a.jsonl", 4
        text = "\n".join([*good, bad]) + "\n"
    else:
        path, number = tmp_path / RECORDS_FILE, 2
        text = "\n".join([good[0], bad, *good[1:]]) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(InputDataError) as err:
        store.load()
    message = str(err.value)
    assert f"1 generation record(s) cannot be read as version {GEN_NOW}: {path}:{number} (" \
        in message
    assert detail in message and fix in message and "to redo their requests" in message
    # finish() reads before it writes: a store that cannot be read is left as it was.
    with pytest.raises(InputDataError):
        store.finish()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_every_unreadable_line_is_counted_before_the_stage_stops(tmp_path: Path) -> None:
    """Lines of several files (two journals, the compacted file, an older per-request file)
    are all read, then reported at once."""
    first, second = store_in(tmp_path), store_in(tmp_path)
    first.append([generation("a")])
    second.append([generation("b")])
    journals = first.journals()
    assert len(journals) == 2
    for journal in journals:
        with journal.open("a") as handle:
            handle.write("{broken\n" + record_line(generation("c")) + "\n")
    (tmp_path / RECORDS_FILE).write_text("{}\n")
    (tmp_path / LEGACY_DIR).mkdir()
    (tmp_path / LEGACY_DIR / "d.json").write_text("[]")
    with pytest.raises(InputDataError, match=r"^4 generation record\(s\)") as err:
        store_in(tmp_path).load()
    named = [f"{journals[0]}:2", f"{journals[1]}:2", f"{tmp_path / RECORDS_FILE}:1",
             str(tmp_path / LEGACY_DIR / "d.json")]
    assert sum(name + " (" in str(err.value) for name in named) == 3  # and 1 more


# ---- records.jsonl: sorted, and the same bytes whatever made it ---------------------------

def test_the_records_file_is_sorted_and_the_same_bytes_whatever_the_order(
        tmp_path: Path) -> None:
    records = [generation(f"req-{n:03d}") for n in (7, 3, 11, 0, 5, 9, 1, 2, 10, 4, 8, 6)]
    want = expected_bytes(records)
    # One writer, in the order of the plan.
    one = store_in(tmp_path / "one")
    for record in records:
        one.append([record])
    one.finish()
    # Three writers (Ray actors, shards), in reverse, with a request written twice (a batch
    # retried after a lost actor) and a finish() in between.
    three = [store_in(tmp_path / "three") for _ in range(3)]
    for n, record in enumerate(reversed(records)):
        three[n % 3].append([record])
        if n == 5:
            three[0].append([records[0]])
            three[1].finish()
    three[2].finish()
    # Records given to finish() directly, in sorted order.
    given = store_in(tmp_path / "given")
    given.finish(sorted(records, key=lambda r: r.request_id))
    for folder in ("one", "three", "given"):
        assert (tmp_path / folder / RECORDS_FILE).read_bytes() == want, folder
    assert [json.loads(line)["request_id"] for line in lines(tmp_path / "one" / RECORDS_FILE)] \
        == sorted(r.request_id for r in records)
    # Finishing again with nothing new changes no byte.
    one.finish()
    assert (tmp_path / "one" / RECORDS_FILE).read_bytes() == want


# ---- older ACRB: a folder of per-request files --------------------------------------------

def test_a_legacy_folder_is_read_and_folded_into_the_records_file(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    legacy = tmp_path / LEGACY_DIR
    for rid in ("a", "b", "c"):
        write_record(legacy / f"{rid}.json", generation(rid, "legacy"))
    # Written by an ACRB of version 3 (with its run measurements) and unstamped (version 2).
    v3 = json.loads(record_line(generation("d")))
    v3.update({RECORD_VERSION_FIELD: 3, "seconds": 1.5, "created_at": "then",
               "peak_gpu_memory_mb": None})
    (legacy / "d.json").write_text(json.dumps(v3))
    unstamped = {k: v for k, v in json.loads(record_line(generation("e"))).items()
                 if not k.startswith("acrb_")}
    (legacy / "e.json").write_text(json.dumps(unstamped))
    store.append([generation("c", "redone")])  # the journal wins over the older file
    assert store.legacy_paths() == sorted(legacy.glob("*.json"))
    loaded = store.load()
    assert sorted(loaded) == ["a", "b", "c", "d", "e"]
    assert loaded["c"].message == "redone" and loaded["d"] == generation("d")
    assert loaded["e"] == generation("e")
    assert store.finish() == loaded
    assert not legacy.exists() and not store.journal_dir.exists()
    assert store.records_file.read_bytes() == expected_bytes(
        [generation("a", "legacy"), generation("b", "legacy"), generation("c", "redone"),
         generation("d"), generation("e")])


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"request_id": ' + "7" * 5000 + "}"],
                         ids=["nested-too-deeply", "huge-number"])
def test_a_legacy_file_json_cannot_read_is_named(tmp_path: Path, text: str) -> None:
    store = store_in(tmp_path)
    (tmp_path / LEGACY_DIR).mkdir()
    bad = tmp_path / LEGACY_DIR / "x.json"
    bad.write_text(text)
    with pytest.raises(InputDataError, match=r"^1 generation record\(s\) cannot be read") as err:
        store.load()
    assert f"{bad} (not JSON ACRB reads: it holds " in err.value.problem
    assert "delete those files to redo their requests" in str(err.value.fix)


def test_a_legacy_file_wins_over_the_records_file(tmp_path: Path) -> None:
    """The load order of the module docstring: records.jsonl, the older files, the journals."""
    store = store_in(tmp_path)
    store.finish([generation("a", "compacted"), generation("b", "compacted")])
    write_record(tmp_path / LEGACY_DIR / "a.json", generation("a", "legacy"))
    assert {rid: r.message for rid, r in store.load().items()} == {"a": "legacy",
                                                                    "b": "compacted"}


# ---- finish() -----------------------------------------------------------------------------

def test_finish_folds_every_journal_and_leaves_no_journal_folder(tmp_path: Path) -> None:
    writers = [store_in(tmp_path) for _ in range(3)]
    for n, writer in enumerate(writers):
        writer.append([generation(f"w{n}-{i}") for i in range(4)])
    assert len(writers[0].journals()) == 3
    folded = writers[0].finish([generation("extra")])
    assert len(folded) == 13 and "extra" in folded
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORDS_FILE]
    assert len(lines(tmp_path / RECORDS_FILE)) == 13


def test_finish_with_nothing_stored_writes_nothing(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    assert store.finish() == {}
    assert list(tmp_path.iterdir()) == []


def test_a_writer_in_another_process_appends_to_a_journal_of_its_own(tmp_path: Path) -> None:
    """A store handed to another process (pickled to a Ray actor, or inherited through a fork)
    after this one appended must not append to this process's journal: a line torn there by a
    kill would no longer be the file's last, and would stop every later run."""
    store = store_in(tmp_path)
    store.append([generation("driver")])
    [mine] = store.journals()
    for method in ("spawn", "fork"):
        context = multiprocessing.get_context(method)
        child = context.Process(target=_append_one, args=(store, f"child-{method}"))
        child.start()
        child.join(60)
        assert child.exitcode == 0, method
    assert [json.loads(line)["request_id"] for line in lines(mine)] == ["driver"]
    assert len(store.journals()) == 3
    assert sorted(store.load()) == ["child-fork", "child-spawn", "driver"]


def _append_one(store: RecordStore[GenerationRecord], request_id: str) -> None:
    store.append([generation(request_id)])


# ---- two processes at once ----------------------------------------------------------------

def _append_then_finish_early(folder: Path, started: Any, finished: Any) -> None:
    """The shard that ends first: it folds the other's journal while the other still runs."""
    store = store_in(folder)
    assert started.wait(60)
    store.append([generation(f"early-{i}") for i in range(5)])
    with store.locked():
        store.finish()
    finished.set()


def _append_across_the_others_finish(folder: Path, started: Any, finished: Any) -> None:
    store = store_in(folder)
    for i in range(3):
        store.append([generation(f"late-{i}")])
    started.set()
    assert finished.wait(60)
    for i in range(3, 6):
        store.append([generation(f"late-{i}")])
    with store.locked():
        store.finish()


def test_a_writer_keeps_appending_after_another_process_finished(tmp_path: Path) -> None:
    """Shard 1 finishes (folds every journal, removes the folder) while shard 0 is still
    running: shard 0's next records are still stored, and its finish folds them."""
    context = multiprocessing.get_context("spawn")
    started, finished = context.Event(), context.Event()
    processes = [context.Process(target=target, args=(tmp_path, started, finished))
                 for target in (_append_across_the_others_finish, _append_then_finish_early)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORDS_FILE]
    assert sorted(json.loads(line)["request_id"] for line in lines(tmp_path / RECORDS_FILE)) \
        == sorted([f"early-{i}" for i in range(5)] + [f"late-{i}" for i in range(6)])


def _append_and_finish_often(folder: Path, prefix: str, count: int, start: Any) -> None:
    store = store_in(folder)
    assert start.wait(60)
    for i in range(count):
        store.append([generation(f"{prefix}-{i:04d}")])
        if i % 3 == 2:
            with store.locked():
                store.finish()
    with store.locked():
        store.finish()


def test_two_processes_appending_and_finishing_at_once_lose_no_record(tmp_path: Path) -> None:
    count = 500
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [context.Process(target=_append_and_finish_often,
                                 args=(tmp_path, prefix, count, start))
                 for prefix in ("p", "q")]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(300)
    assert [p.exitcode for p in processes] == [0, 0]
    assert not (tmp_path / JOURNAL_DIR).exists()
    stored = [json.loads(line)["request_id"] for line in lines(tmp_path / RECORDS_FILE)]
    assert stored == sorted(f"{prefix}-{i:04d}" for prefix in ("p", "q") for i in range(count))


# ---- the stages' outputs ------------------------------------------------------------------

MODEL = "synthetic-biased"
JUDGES = ("sim-judge-a", "sim-judge-b")


def _output_folders(root: Path) -> dict[str, tuple[Path, type[Any]]]:
    return {"generate": (root / layout.generations_dir(MODEL), GenerationRecord),
            "evaluate": (root / layout.judgements_dir(MODEL), JudgementRecord),
            **{f"judge {name}": (root / layout.scores_dir(MODEL) / name, ScoreRecord)
               for name in JUDGES}}


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two portraits x the catalog's prompts for one editor: generated, evaluated, judged."""
    root = tmp_path_factory.mktemp("journal") / "project"
    yield one_model_project(root, MODEL, judged=True, analysed=False, changes={
        "sources": {"races": ["Black", "White"], "genders": ["Female"], "ages": ["20s"]}})


@pytest.fixture
def copy(staged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StageContext:
    root = tmp_path / "project"
    shutil.copytree(staged, root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    monkeypatch.chdir(root)
    return StageContext.load(root / "params.yaml", root)


def test_each_stage_leaves_one_records_file_with_a_line_per_planned_request(
        staged: Path) -> None:
    ctx = StageContext.load(staged / "params.yaml", staged)
    planned = sorted(ctx.model_requests(MODEL)["request_id"])
    assert len(planned) == 100
    for stage, (folder, record_type) in _output_folders(staged).items():
        assert not (folder / LEGACY_DIR).exists(), stage
        assert not (folder / JOURNAL_DIR).exists(), stage
        stored = [json.loads(line) for line in lines(folder / RECORDS_FILE)]
        assert [row["request_id"] for row in stored] == planned, stage
        assert {(row["acrb_table"], row[RECORD_VERSION_FIELD]) for row in stored} == {
            (record_type.table, record_type.version)}, stage
    assert not [p for p in (staged / "data").rglob("records") if p.is_dir()]


def test_a_record_torn_by_a_kill_is_redone_and_the_output_rewritten_as_before(
        copy: StageContext) -> None:
    folder = copy.path(layout.generations_dir(MODEL))
    records = folder / RECORDS_FILE
    before = records.read_bytes()
    kept = lines(records)
    # As a run killed while storing the last record leaves it: in a journal, cut short.
    records.write_text("".join(line + "\n" for line in kept[:-1]))
    (folder / JOURNAL_DIR).mkdir()
    (folder / JOURNAL_DIR / "4242-0123456789ab.jsonl").write_text(
        kept[-2] + "\n" + kept[-1][:-20])
    summary = generate.run(copy, MODEL)
    assert (summary.generated, summary.skipped) == (1, 99)
    assert records.read_bytes() == before
    assert not (folder / JOURNAL_DIR).exists()


def test_older_per_request_folders_are_folded_in_and_nothing_is_redone(
        copy: StageContext) -> None:
    """Every output as an older ACRB left it (a file per request under ``records/``): each
    stage reuses every record and rewrites the output as a fresh run writes it."""
    folders = _output_folders(copy.root)
    before = {}
    for folder, record_type in folders.values():
        before[folder] = (folder / RECORDS_FILE).read_bytes()
        store = RecordStore(folder, record_type)
        for request_id, record in store.load().items():
            write_record(folder / LEGACY_DIR / f"{request_id}.json", record)
        store.records_file.unlink()
    assert generate.run(copy, MODEL).generated == 0
    assert evaluate.run(copy, MODEL).judged == 0
    summary = judge.run(copy, MODEL)
    assert summary.asked == dict.fromkeys(JUDGES, 0)
    assert summary.reused == dict.fromkeys(JUDGES, 100)
    for stage, (folder, _) in folders.items():
        assert (folder / RECORDS_FILE).read_bytes() == before[folder], stage
        assert not (folder / LEGACY_DIR).exists(), stage
        assert not (folder / JOURNAL_DIR).exists(), stage


def test_a_stored_score_outside_the_rubric_is_refused_naming_judge_request_and_axis(
        copy: StageContext) -> None:
    """An answer read back from a judge's records (edited by hand, or damaged) would flow into
    the verdicts: a score the rubric cannot give is refused, and nothing is rewritten."""
    folder = copy.path(layout.scores_dir(MODEL)) / JUDGES[0]
    records = folder / RECORDS_FILE
    rows = [json.loads(line) for line in lines(records)]
    scored = [row for row in rows if row["status"] == "scored"
              and row["edit_success"] is not None]
    assert len(scored) >= 2
    scored[0]["edit_success"] = 9
    scored[1]["edit_success"] = 0
    records.write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = {p: p.read_bytes() for p in copy.root.joinpath("data").rglob("*") if p.is_file()}
    with pytest.raises(InputDataError) as err:
        judge.run(copy, MODEL)
    problem = err.value.problem
    assert problem.startswith(f"judge '{JUDGES[0]}': 2 stored score(s) in {folder} outside "
                              "the ranges of rubric acrb@1: ")
    assert f"request {scored[0]['request_id']}: edit_success = 9 (range 1-5)" in problem
    assert f"request {scored[1]['request_id']}: edit_success = 0 (range 1-5)" in problem
    assert f"delete {folder} to rerun judge '{JUDGES[0]}'" in str(err.value.fix)
    after = {p: p.read_bytes() for p in copy.root.joinpath("data").rglob("*") if p.is_file()}
    assert after == before


def test_a_judges_table_edited_after_the_judge_stage_is_refused_by_the_analysis(
        copy: StageContext) -> None:
    """The tables the analysis reads (each judge's scores, the combined verdicts) are checked
    against the rubric when read: an edited score never reaches a rate; the combined score of
    two judges may be a fraction (a mean), one judge's may not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from acrb.analysis.inputs import analysis_frame
    from acrb.stages.analyze import read_scores

    def edited(path: Path, change: Any) -> Any:
        """Edit a table in place, keeping its schema and ACRB's stamp (as a careful hand
        would, so that only the value is wrong)."""
        stored = pq.read_table(path)
        frame = stored.to_pandas()
        change(frame)
        pq.write_table(pa.Table.from_pandas(frame, schema=stored.schema, preserve_index=False),
                       path)
        return frame

    judge.run(copy, MODEL)
    scores = copy.path(layout.scores_table(MODEL, JUDGES[0]))
    stored = pq.read_table(scores).to_pandas()
    scored = stored.index[stored["status"] == "scored"]
    table = edited(scores, lambda f: f.__setitem__(
        "edit_success", f["edit_success"].mask(f.index == scored[0], 9)))
    with pytest.raises(InputDataError) as err:
        read_scores(copy, MODEL)
    assert err.value.problem.startswith(
        f"judge '{JUDGES[0]}': 1 stored score(s) in {scores} outside the ranges of rubric "
        f"acrb@1: request {table.loc[scored[0], 'request_id']}: edit_success = 9")
    assert f"judge@{MODEL}" in str(err.value.fix)
    verdicts_path = copy.path(layout.verdicts_table(MODEL))
    first = pq.read_table(verdicts_path).to_pandas()["status"].eq("scored").idxmax()

    def set_skin_tone(value: float) -> Any:
        return lambda f: f.__setitem__("skin_tone", f["skin_tone"].mask(f.index == first,
                                                                        value))

    edited(verdicts_path, set_skin_tone(3.5))  # a mean of two judges: accepted
    assert len(analysis_frame(copy, MODEL)) > 0
    edited(verdicts_path, set_skin_tone(7.0))
    with pytest.raises(InputDataError, match=r"judge 'ensemble': 1 stored score\(s\) in .* "
                                             r"skin_tone = 7\.0 \(range 1-5\)"):
        analysis_frame(copy, MODEL)
