"""Tampering with either tool's audit log is caught by `verify`, through the store (the function
the CLI calls) and through `acrb curate verify` / `acrb review verify` (exit 1), both for a
working folder (anchored in its database) and for a finalized export (anchored in its
manifest's entry count and head hash). Also: lines past the recorded head are set aside and
reported until a person resolves them, a rolled-back append leaves no line behind, and a crash
between the append and the commit leaves the tool usable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import acrb
from acrb.cli import app
from acrb.curation.store import CurationStore
from acrb.errors import InputDataError
from acrb.review.store import ReviewStore
from acrb.web.accounts import AccountStore
from acrb.web.audit import AUDIT_SCHEMA, AuditTrail, canonical, entry_hash, seal, verify
from acrb.web.database import Database

TOOLS: dict[str, tuple[str, Callable[[Path], AccountStore]]] = {
    "curate": ("curation", lambda folder: CurationStore(folder)),
    "review": ("review", lambda folder: ReviewStore(folder)),
}


def _build(tool: str, folder: Path) -> None:
    store: CurationStore | ReviewStore
    if tool == "curate":
        store, word = CurationStore(folder, create=True), "curator"
    else:
        store, word = ReviewStore(folder, create=True), "rater"
    token = store.add_user("alice")
    store.add_user("bob")
    found = store.login(token)
    assert found is not None
    store.login(token)
    store.logout(found[0])
    store.note({"action": "note", word: "", "text": "seven entries or so"})
    store.close()


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tools")
    for tool, (name, _) in TOOLS.items():
        _build(tool, root / name)
    return {tool: root / name for tool, (name, _) in TOOLS.items()}


# ----------------------------------------------------------------------------- tampers


def _entries(lines: list[bytes]) -> list[dict]:
    return [json.loads(x) for x in lines]


def _line(entry: dict) -> bytes:
    return (canonical(entry) + "\n").encode()


def _edit(lines: list[bytes]) -> bytes:
    entry = json.loads(lines[2])
    entry["at"] = "2020-01-01T00:00:00.000+00:00"
    return b"".join([*lines[:2], _line(entry), *lines[3:]])


def _edit_own_hash(lines: list[bytes]) -> bytes:
    """Line 3 edited and its own hash recomputed; the next line's ``prev`` still names the
    old hash, so only the prev-link check catches it without the database's copy."""
    entry = json.loads(lines[2])
    entry["at"] = "2020-01-01T00:00:00.000+00:00"
    entry["hash"] = entry_hash(entry)
    return b"".join([*lines[:2], _line(entry), *lines[3:]])


def _rewrite_chain(lines: list[bytes]) -> bytes:
    """Line 3 edited and every later hash recomputed: the file's own chain is intact, so
    only the anchor (the database's lines, the recorded head) catches it."""
    entries = _entries(lines)
    entries[2]["at"] = "2020-01-01T00:00:00.000+00:00"
    prev = entries[1]["hash"]
    for entry in entries[2:]:
        entry["prev"] = prev
        entry["hash"] = entry_hash(entry)
        prev = entry["hash"]
    return b"".join(_line(e) for e in entries)


def _delete(lines: list[bytes]) -> bytes:
    return b"".join(lines[:2] + lines[3:])


def _swap(lines: list[bytes]) -> bytes:
    return b"".join([lines[0], lines[2], lines[1], *lines[3:]])


def _insert(lines: list[bytes]) -> bytes:
    """A forged entry, correctly chained onto line 2, inserted as line 3."""
    forged = seal({"action": "login", "at": json.loads(lines[1])["at"], "who": "mallory"},
                  3, json.loads(lines[1])["hash"])
    return b"".join([*lines[:2], _line(forged), *lines[2:]])


def _append_forged(lines: list[bytes]) -> bytes:
    last = json.loads(lines[-1])
    forged = seal({"action": "login", "at": last["at"], "who": "mallory"},
                  last["seq"] + 1, last["hash"])
    return b"".join([*lines, _line(forged)])


def _append_garbage(lines: list[bytes]) -> bytes:
    return b"".join([*lines, b"\xff\xfe not json at all\n"])


def _truncate_last(lines: list[bytes]) -> bytes:
    return b"".join(lines[:-1])


def _truncate_last_two(lines: list[bytes]) -> bytes:
    return b"".join(lines[:-2])


def _truncate_mid_line(lines: list[bytes]) -> bytes:
    return b"".join(lines)[:-25]


#: tamper -> (change, what the working folder's verify says, what the export's says)
TAMPERS: dict[str, tuple[Callable[[list[bytes]], bytes], str, str]] = {
    "edit": (_edit, "edited after it was written", "edited after it was written"),
    "edit_own_hash": (_edit_own_hash, "differs from the entry the database recorded",
                      "prev does not match"),
    "rewrite_chain": (_rewrite_chain, "differs from the entry the database recorded",
                      "not at the recorded head"),
    "delete": (_delete, "removed, added or reordered", "removed, added or reordered"),
    "swap": (_swap, "removed, added or reordered", "removed, added or reordered"),
    "insert": (_insert, "differs from the entry the database recorded",
               "removed, added or reordered"),
    "append_forged": (_append_forged, "past the recorded head", "past the recorded head"),
    "append_garbage": (_append_garbage, "past the recorded head", "past the recorded head"),
    "truncate_last": (_truncate_last, "removed from the end", "removed from the end"),
    "truncate_last_two": (_truncate_last_two, "removed from the end", "removed from the end"),
    "truncate_mid_line": (_truncate_mid_line, "cut mid-line", "cut mid-line"),
}


def _tamper(log: Path, name: str) -> None:
    log.write_bytes(TAMPERS[name][0](log.read_bytes().splitlines(keepends=True)))


def _export(folder: Path, out: Path) -> Path:
    """A finalized export's shape: the log and a manifest holding its count and head."""
    out.mkdir()
    shutil.copyfile(folder / "audit.jsonl", out / "audit.jsonl")
    last = json.loads((out / "audit.jsonl").read_bytes().splitlines()[-1])
    (out / "manifest.json").write_text(json.dumps(
        {"audit": {"file": "audit.jsonl", "entries": last["seq"], "head": last["hash"]}}))
    return out


@pytest.mark.parametrize("name", TAMPERS)
@pytest.mark.parametrize("tool", TOOLS)
def test_a_tampered_working_log_fails_verify(templates: dict[str, Path], tmp_path: Path,
                                             tool: str, name: str) -> None:
    folder = shutil.copytree(templates[tool], tmp_path / "work")
    assert CliRunner().invoke(app, [tool, "verify", str(folder)]).exit_code == 0
    _tamper(folder / "audit.jsonl", name)
    expected = TAMPERS[name][1]

    result = CliRunner().invoke(app, [tool, "verify", str(folder)])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and expected in result.output

    check = TOOLS[tool][1](folder).verify()  # what the CLI calls; again: nothing forgotten
    assert not check.ok and expected in check.problem


@pytest.mark.parametrize("name", TAMPERS)
@pytest.mark.parametrize("tool", TOOLS)
def test_a_tampered_export_fails_verify(templates: dict[str, Path], tmp_path: Path,
                                        tool: str, name: str) -> None:
    out = _export(templates[tool], tmp_path / "export")
    assert CliRunner().invoke(app, [tool, "verify", str(out)]).exit_code == 0
    _tamper(out / "audit.jsonl", name)
    expected = TAMPERS[name][2]

    result = CliRunner().invoke(app, [tool, "verify", str(out)])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and expected in result.output

    anchor = json.loads((out / "manifest.json").read_text())["audit"]
    check = verify(out / "audit.jsonl", expected_head=anchor["head"],
                   expected_entries=anchor["entries"])
    assert not check.ok and expected in check.problem


def test_each_check_is_needed_on_its_own(templates: dict[str, Path], tmp_path: Path) -> None:
    """Against the head alone (an export): an edit with its own hash recomputed is caught
    only by the prev link, a recomputed chain only by the head comparison."""
    log = tmp_path / "audit.jsonl"
    original = (templates["curate"] / "audit.jsonl").read_bytes()
    lines = original.splitlines(keepends=True)
    head = json.loads(lines[-1])["hash"]

    log.write_bytes(_edit_own_hash(lines))
    check = verify(log, expected_head=head)
    assert not check.ok and check.line == 4 and "prev does not match" in check.problem

    log.write_bytes(_rewrite_chain(lines))
    check = verify(log, expected_head=head)
    assert not check.ok and "not at the recorded head" in check.problem
    assert verify(log, expected_head=check.head).ok  # the file's own chain is intact


# ----------------------------------------------------------------- past the recorded head


@pytest.mark.parametrize("tool", TOOLS)
def test_an_appended_forgery_is_set_aside_reported_until_resolved_and_never_chained(
        templates: dict[str, Path], tmp_path: Path, tool: str) -> None:
    folder = shutil.copytree(templates[tool], tmp_path / "work")
    log = folder / "audit.jsonl"
    before = log.read_bytes()
    _tamper(log, "append_forged")
    forged = log.read_bytes()[len(before):]

    for _ in range(2):  # the first verify sets it aside; the second still fails
        result = CliRunner().invoke(app, [tool, "verify", str(folder)])
        assert result.exit_code == 1
        assert "1 line(s) past the recorded head" in result.output
        assert "an interrupted write or an appended forgery" in result.output
        assert f"{tool} verify {folder} --resolve" in result.output  # the fix line
    [aside] = folder.glob("audit.jsonl.past-head-*")
    assert aside.name in result.output
    assert aside.read_bytes() == forged and log.read_bytes() == before

    result = CliRunner().invoke(app, [tool, "verify", str(folder), "--resolve",
                                      "--by", "alice"])
    assert result.exit_code == 0, result.output
    assert "resolved: 1 line(s)" in result.output and result.output.count("ok:") == 1
    last = json.loads(log.read_bytes().splitlines()[-1])
    assert last["action"] == "resolve_set_aside" and last["by"] == "alice"
    assert last["file"] == aside.name and last["file_intact"]
    assert forged not in log.read_bytes() and aside.read_bytes() == forged
    assert CliRunner().invoke(app, [tool, "verify", str(folder)]).exit_code == 0


def test_resolve_refuses_a_log_broken_before_its_head(templates: dict[str, Path],
                                                      tmp_path: Path) -> None:
    folder = shutil.copytree(templates["review"], tmp_path / "work")
    _tamper(folder / "audit.jsonl", "edit")
    result = CliRunner().invoke(app, ["review", "verify", str(folder), "--resolve"])
    assert result.exit_code == 2
    assert "error: the audit log does not verify" in result.output
    assert "resolved only on an intact log" in result.output


def test_a_line_appended_while_the_store_is_open_is_caught_and_not_chained_onto(
        templates: dict[str, Path], tmp_path: Path) -> None:
    folder = shutil.copytree(templates["curate"], tmp_path / "work")
    store = CurationStore(folder)
    _tamper(folder / "audit.jsonl", "append_forged")
    check = store.verify()
    assert not check.ok and "1 line(s) past the recorded head" in check.problem
    with pytest.raises(InputDataError, match="changed outside the tool"):
        store.add_curator("carol")
    assert "carol" not in store.curators()


def test_a_rolled_back_append_leaves_no_line(tmp_path: Path) -> None:
    database = Database(tmp_path / "tool.sqlite", AUDIT_SCHEMA)
    trail = AuditTrail(database, tmp_path / "audit.jsonl")
    with database.write() as con:
        trail.append(con, {"action": "first"})
    before = trail.path.read_bytes()
    with pytest.raises(RuntimeError), database.write() as con:
        trail.append(con, {"action": "never committed"})
        raise RuntimeError("the change the line records failed")
    assert trail.path.read_bytes() == before
    with database.write() as con:
        trail.append(con, {"action": "second"})
    assert trail.verify().ok and trail.head()[0] == 2


CRASH = """
import os, sys
from acrb.curation.store import CurationStore
store = CurationStore(sys.argv[1])
with store._db.write() as con:
    store._audit.append(con, {"action": "add_curator", "curator": "carol"})
    os._exit(9)  # killed between the append and the commit
"""


def test_a_crash_between_append_and_commit_is_reported_and_the_tool_stays_usable(
        templates: dict[str, Path], tmp_path: Path) -> None:
    folder = shutil.copytree(templates["curate"], tmp_path / "work")
    before = (folder / "audit.jsonl").read_bytes()
    env = {**os.environ, "PYTHONPATH": str(Path(acrb.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", CRASH, str(folder)], env=env,
                          capture_output=True, timeout=120)
    assert done.returncode == 9, done.stderr
    assert len((folder / "audit.jsonl").read_bytes()) > len(before)

    store = CurationStore(folder)  # opening sets the line aside...
    assert (folder / "audit.jsonl").read_bytes() == before
    check = store.verify()  # ...and verify says so until it is resolved
    assert not check.ok and "set aside, unresolved" in check.problem
    store.add_curator("carol")  # usable: the chain goes on from the recorded head
    assert "carol" in store.curators()
    result = CliRunner().invoke(app, ["curate", "verify", str(folder)])
    assert result.exit_code == 1 and "past-head-" in result.output
    result = CliRunner().invoke(app, ["curate", "verify", str(folder), "--resolve"])
    assert result.exit_code == 0, result.output
    assert store.verify().ok
