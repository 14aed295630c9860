"""A review that cannot be changed behind its log: `acrb review verify` compares the ratings
table with the log's rate entries and an export's files with its manifest; finalize swaps a
whole export in or leaves the old one; a torn last log line that committed nothing is resolved
by the tool; k above the registered raters is said at `serve`, `status` and `finalize`."""

from __future__ import annotations

import errno
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from acrb.cli import app
from acrb.curation.store import CurationStore
from acrb.errors import InputDataError
from acrb.review import finalize as review_finalize
from acrb.review.finalize import finalize, verify_export
from acrb.review.store import ReviewStore
from tests.review_fixtures import answers_for, make_review_store


def _rate(store: ReviewStore, rater: str, count: int, value: int = 3) -> None:
    for _ in range(count):
        claim = store.next_item(rater)
        assert claim is not None
        store.rate(rater, claim.item.item_id, answers_for(claim.shown_order, value),
                   claim.shown_order, 1000)


def _rated(tmp_path: Path) -> ReviewStore:
    """Two raters, k=2, six items (every other a pair), three items rated by each."""
    store, _ = make_review_store(tmp_path, ("a", "b"), items=6, k=2)
    _rate(store, "a", 3)
    _rate(store, "b", 3, value=4)
    return store


def _sql(store: ReviewStore, statement: str, *args: Any) -> None:
    con = sqlite3.connect(store.database)
    with con:
        con.execute(statement, args)
    con.close()


def _verify(folder: Path) -> Any:
    return CliRunner().invoke(app, ["review", "verify", str(folder)])


# ------------------------------------------------------------- the database against the log


def test_an_untouched_review_verifies(tmp_path: Path) -> None:
    store = _rated(tmp_path)
    assert store.verify().ok
    assert _verify(store.workdir).exit_code == 0


def test_a_rating_edited_in_the_database_fails_verify_and_finalize(tmp_path: Path) -> None:
    store = _rated(tmp_path)
    target = store.ratings()[2]
    _sql(store, "UPDATE ratings SET skin_tone = 5 WHERE rating_id = ?", target.rating_id)

    result = _verify(store.workdir)
    assert result.exit_code == 1, result.output
    assert "review.sqlite: table ratings does not match the audit log" in result.output
    assert f"rating {target.rating_id} (rater a, item {target.item_id}" in result.output
    assert "skin_tone is 5 in the database, 3 in the log" in result.output
    assert "restore review.sqlite from a backup" in result.output

    with pytest.raises(InputDataError, match=target.rating_id):
        finalize(store, tmp_path / "export")
    assert not (tmp_path / "export" / "ratings.parquet").exists()
    served = CliRunner().invoke(app, ["review", "serve", "--workdir", str(store.workdir)])
    assert served.exit_code == 2 and "does not verify" in served.output


def test_a_rating_deleted_from_the_database_is_named(tmp_path: Path) -> None:
    store = _rated(tmp_path)
    ratings = store.ratings()
    gone = ratings[-1]
    _sql(store, "DELETE FROM ratings WHERE rating_id = ?", gone.rating_id)
    check = store.verify()
    assert not check.ok and check.path == store.database
    assert f"{len(ratings) - 1} rating(s) in the database, {len(ratings)} in the log" \
        in check.problem
    assert f"in the log only (deleted from the database): {gone.rating_id} (rater b" \
        in check.problem
    with pytest.raises(InputDataError, match="deleted from the database"):
        finalize(store, tmp_path / "export")


def test_a_rating_inserted_into_the_database_is_named(tmp_path: Path) -> None:
    store = _rated(tmp_path)
    _sql(store, "INSERT INTO ratings (rating_id, claim_id, rater, item_id, output, "
         "edit_success, skin_tone, race_change, gender_change, age_change, repeat, "
         "created_at, audit_seq) SELECT 'rt-forged', claim_id, rater, item_id, output, 1, 1, "
         "1, 1, 1, repeat, created_at, audit_seq FROM ratings LIMIT 1")
    result = _verify(store.workdir)
    assert result.exit_code == 1
    assert "in the database only (inserted behind the log): rt-forged (rater" in result.output
    assert f"{len(store.ratings())} rating(s) in the database" in result.output


@pytest.mark.parametrize(("column", "value"), [("rater", "c"), ("shown_first", 0),
                                               ("repeat", 1), ("duration_ms", 1),
                                               ("audit_seq", 1), ("age_direction", 2)])
def test_every_logged_column_is_compared(tmp_path: Path, column: str, value: Any) -> None:
    store = _rated(tmp_path)
    paired = next(r for r in store.ratings() if r.shown_first is True)
    _sql(store, f"UPDATE ratings SET {column} = ? WHERE rating_id = ?", value,
         paired.rating_id)
    check = store.verify()
    assert not check.ok and f"rating {paired.rating_id}" in check.problem
    assert f"{column} is {value!r} in the database" in check.problem


# ------------------------------------------------------------------ an export's files


def _export(tmp_path: Path) -> Path:
    store = _rated(tmp_path)
    return finalize(store, tmp_path / "export").folder


def test_an_untouched_export_verifies_with_its_files(tmp_path: Path) -> None:
    out = _export(tmp_path)
    result = _verify(out)
    assert result.exit_code == 0, result.output
    assert "ok: 4 file(s) match the sha256 in manifest.json" in result.output


def _edit_parquet(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


def _edit_csv(path: Path) -> None:
    path.write_text(path.read_text().replace(",3,", ",5,", 1))


@pytest.mark.parametrize(("name", "change", "said"), [
    ("ratings.parquet", _edit_parquet, "the file was changed after the export"),
    ("ratings.csv", _edit_csv, "the file was changed after the export"),
    ("items.parquet", Path.unlink, "is listed in manifest.json but missing"),
])
def test_an_export_file_changed_or_deleted_fails_verify_naming_it(
        tmp_path: Path, name: str, change: Any, said: str) -> None:
    out = _export(tmp_path)
    before = (out / name).read_bytes()
    change(out / name)
    assert not (out / name).exists() or (out / name).read_bytes() != before
    result = _verify(out)
    assert result.exit_code == 1, result.output
    assert f"FAILED: {out / name}" in result.output and said in result.output
    assert "acrb review finalize" in result.output  # the fix
    check = verify_export(out)
    assert not check.ok and check.path == out / name


def test_a_manifest_naming_a_file_outside_the_export_fails(tmp_path: Path) -> None:
    out = _export(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"]["../review-work/review.sqlite"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(manifest))
    check = verify_export(out)
    assert not check.ok and "not a file of the export" in check.problem


# ------------------------------------------------------------------ a failed finalize


def test_a_finalize_that_fails_part_way_leaves_the_previous_export(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _rated(tmp_path)
    out = finalize(store, tmp_path / "export").folder
    (out / "survey.parquet").write_bytes(b"someone else's file")
    exported = {p.name: p.read_bytes() for p in out.iterdir()}
    _rate(store, "a", 1)

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    # After the two Parquet tables, before the CSV: a write half-way through the set.
    monkeypatch.setattr(review_finalize, "write_csv", full_disk)
    with pytest.raises(InputDataError) as caught:
        finalize(store, out)
    assert f"the export to {out} could not be written" in caught.value.problem
    assert "No space left on device" in caught.value.problem
    assert "the export that was there is unchanged" in str(caught.value.fix)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == exported  # no staging left
    assert verify_export(out).ok and _verify(out).exit_code == 0

    monkeypatch.undo()
    again = finalize(store, out)
    assert verify_export(out).ok and again.ratings == len(store.ratings())
    assert (out / "survey.parquet").read_bytes() == b"someone else's file"
    assert sorted(p.name for p in out.iterdir()) == sorted(exported)


def test_a_failure_while_renaming_leaves_an_export_that_fails_verify_not_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _rated(tmp_path)
    out = finalize(store, tmp_path / "export").folder
    _rate(store, "a", 1)
    real = review_finalize.os.replace
    moved: list[str] = []

    def replace(source: Path, target: Path) -> None:
        if Path(target).parent == out:  # a rename into the export, not a staged write
            if len(moved) == 1:
                raise OSError(errno.EIO, "Input/output error")
            moved.append(Path(target).name)
        real(source, target)

    monkeypatch.setattr(review_finalize.os, "replace", replace)
    with pytest.raises(InputDataError, match="could not be written"):
        finalize(store, out)
    monkeypatch.undo()
    # The manifest goes last: the one there still names the old files' digests.
    check = verify_export(out)
    assert not check.ok and check.path == out / moved[0]


def test_an_export_log_stops_at_its_finalize_entry(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = _rated(tmp_path)
    note = store.note

    def note_then_another(entry: dict[str, Any]) -> dict[str, Any]:
        sealed = note(entry)
        note({"action": "note", "rater": "", "text": "written meanwhile"})
        return sealed

    monkeypatch.setattr(store, "note", note_then_another)
    out = finalize(store, tmp_path / "export").folder
    last = json.loads((out / "audit.jsonl").read_text().splitlines()[-1])
    assert last["action"] == "finalize" and verify_export(out).ok


# ------------------------------------------------------------------ a torn last line

TORN = b'{"action":"rate","answers":{"edited":{"age_change":3,"edit_su'


def _torn(store: ReviewStore, data: bytes = TORN) -> Path:
    """The folder as a crash in the middle of writing a log line leaves it."""
    folder = store.workdir
    store.close()
    with open(folder / "audit.jsonl", "ab") as handle:
        handle.write(data)
    return folder


def test_a_torn_last_line_is_resolved_when_the_folder_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _rated(tmp_path)
    seq, _ = store.head()
    before = store.log.read_bytes()
    folder = _torn(store)
    served: list[Any] = []
    monkeypatch.setattr("acrb.review.web.serve", lambda *a, **k: served.append(k))
    result = CliRunner().invoke(app, ["review", "serve", "--workdir", str(folder)])
    assert result.exit_code == 0, result.output
    assert served and served[0]["trusted_proxies"] == ()

    log = (folder / "audit.jsonl").read_bytes()
    assert log.startswith(before) and log[len(before):].count(b"\n") == 1  # TORN is gone
    last = json.loads(log.splitlines()[-1])
    assert last["action"] == "resolved_torn_line" and last["seq"] == seq + 1
    assert last["after_seq"] == seq and last["bytes"] == len(TORN)
    assert last["sha256"] == hashlib.sha256(TORN).hexdigest()
    [aside] = folder.glob("audit.jsonl.past-head-*")
    assert aside.read_bytes() == TORN and last["file"] == aside.name
    reopened = ReviewStore(folder)
    assert reopened.verify().ok and _verify(folder).exit_code == 0
    _rate(reopened, "a", 1)  # the chain goes on
    assert reopened.verify().ok


@pytest.mark.parametrize("data", [
    b'{"action":"rate","seq":99}',  # a whole entry without its line end
    b'{"action":"rate"}\n{"action":"ra',  # more than the last line
    b'{"action":"login"}\n',  # a whole line
], ids=["json", "two-lines", "whole-line"])
def test_anything_but_one_torn_line_still_waits_for_a_person(tmp_path: Path,
                                                             data: bytes) -> None:
    folder = _torn(_rated(tmp_path), data)
    check = ReviewStore(folder).verify()
    assert not check.ok and "set aside, unresolved" in check.problem
    result = CliRunner().invoke(app, ["review", "serve", "--workdir", str(folder)])
    assert result.exit_code == 2 and "--resolve" in result.output


def test_a_torn_line_is_kept_when_the_database_holds_a_rating_past_the_head(
        tmp_path: Path) -> None:
    store = _rated(tmp_path)
    seq, _ = store.head()
    _sql(store, "UPDATE ratings SET audit_seq = ? WHERE rating_id = ?", seq + 1,
         store.ratings()[-1].rating_id)
    folder = _torn(store)
    check = ReviewStore(folder).verify()
    assert not check.ok and "set aside, unresolved" in check.problem
    assert b"resolved_torn_line" not in (folder / "audit.jsonl").read_bytes()


def test_curation_still_leaves_a_torn_line_to_a_person(tmp_path: Path) -> None:
    store = CurationStore(tmp_path / "curation", create=True)
    store.add_curator("alice")
    store.close()
    with open(tmp_path / "curation" / "audit.jsonl", "ab") as handle:
        handle.write(TORN)
    check = CurationStore(tmp_path / "curation").verify()
    assert not check.ok and "set aside, unresolved" in check.problem


# ------------------------------------------------------------------ k above the raters


def test_k_above_the_registered_raters_is_said_at_serve_status_and_finalize(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = make_review_store(tmp_path, ("a", "b"), items=3, k=3)
    _rate(store, "a", 1)
    said = ("warning: review.raters_per_item is 3 but only 2 rater(s) are registered: no "
            "item can reach 3 ratings until 1 more rater(s) are added")
    assert store.too_few_raters() is not None and said in store.too_few_raters()
    monkeypatch.setattr("acrb.review.web.serve", lambda *a, **k: None)
    workdir = ["--workdir", str(store.workdir)]
    served = CliRunner().invoke(app, ["review", "serve", *workdir])
    assert served.exit_code == 0 and said in served.output  # serving still allowed
    status = CliRunner().invoke(app, ["review", "status", *workdir])
    assert status.exit_code == 0 and said in status.output
    done = CliRunner().invoke(app, ["review", "finalize", *workdir,
                                    "--out", str(tmp_path / "export")])
    assert done.exit_code == 0 and said in done.output

    store.add_rater("c")
    assert store.too_few_raters() is None
    for command in ("serve", "status"):
        result = CliRunner().invoke(app, ["review", command, *workdir])
        assert result.exit_code == 0 and "warning" not in result.output

