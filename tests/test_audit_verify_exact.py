"""`verify` of an audit log, field by field: for each way a log can break, the exact outcome
(ok, entries read, head reached, the line named, the problem, lines past the head).

The tamper tests (tests/test_audit_tamper.py) show every tampering fails through both tools'
commands; these pin what `verify` reports, so a verdict, count or message that goes wrong in
one branch (a failure reported as ok, a wrong line number) fails here. Each log is sealed with
the module's own `seal`, three entries long.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from acrb.web.audit import GENESIS, PAST_HEAD, canonical, seal, verify


def chain(n: int = 3) -> list[dict]:
    entries, prev = [], GENESIS
    for seq in range(1, n + 1):
        entry = seal({"at": f"2026-01-0{seq}T00:00:00.000+00:00", "action": f"a{seq}"}, seq,
                     prev)
        entries.append(entry)
        prev = entry["hash"]
    return entries


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes(("\n".join(lines) + end).encode() if lines else b"")
    return path


def outcome(result) -> tuple:
    assert isinstance(result.path, Path)  # every outcome names its log
    return (result.ok, result.entries, result.head, result.line, result.problem,
            result.past_head)


ENTRIES = chain()
LINES = [canonical(e) for e in ENTRIES]
H1, H2, H3 = (e["hash"] for e in ENTRIES)


def test_an_intact_log_is_ok_and_names_its_head(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", LINES)
    result = verify(log, H3, expected_lines=LINES)
    assert outcome(result) == (True, 3, H3, None, "", 0)
    assert result.message() == f"{log}: 3 entries, chain intact, head {H3[:16]}"
    assert outcome(verify(log, H3)) == (True, 3, H3, None, "", 0)
    assert outcome(verify(log, H3, expected_entries=3)) == (True, 3, H3, None, "", 0)


def test_an_empty_log_with_nothing_recorded_is_ok(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", [])
    assert outcome(verify(log, GENESIS)) == (True, 0, GENESIS, None, "", 0)


def test_a_missing_log_fails(tmp_path: Path) -> None:
    result = verify(tmp_path / "absent.jsonl", H3)
    assert outcome(result) == (False, 0, GENESIS, None, "audit log not found", 0)
    assert result.message() == f"{tmp_path / 'absent.jsonl'}: audit log not found"
    assert result.path == tmp_path / "absent.jsonl"


def _garbage(lines: list[str]) -> list[str]:
    return [lines[0], "this is not json", lines[2]]


def _list_line(lines: list[str]) -> list[str]:
    return [lines[0], "[1, 2]", lines[2]]


def _swap(lines: list[str]) -> list[str]:
    return [lines[0], lines[2], lines[1]]


def _wrong_prev(lines: list[str]) -> list[str]:
    forged = seal({"at": "x", "action": "forged"}, 2, "f" * 64)
    return [lines[0], canonical(forged), lines[2]]


def _edited_content(lines: list[str]) -> list[str]:
    edited = {**json.loads(lines[1]), "action": "edited"}
    return [lines[0], canonical(edited), lines[2]]


SEQ = "seq is 3, expected 2: lines were removed, added or reordered"
PREV = ("prev does not match the hash of the line before: a line before it was edited, "
        "removed or inserted")
HASH = "hash does not match the entry's content: the line was edited after it was written"


@pytest.mark.parametrize(("tamper", "problem"), [
    (_swap, SEQ),
    (_wrong_prev, PREV),
    (_edited_content, HASH),
    (_list_line, "not a JSON object (not a JSON object): the line was edited or cut"),
], ids=["swap", "wrong-prev", "edited", "json-list"])
def test_a_broken_second_line_is_named_after_one_good_entry(
        tmp_path: Path, tamper, problem: str) -> None:
    log = write(tmp_path / "audit.jsonl", tamper(LINES))
    result = verify(log, H3, expected_lines=LINES)
    assert outcome(result) == (False, 1, H1, 2, problem, 0) and result.path == log
    assert result.message() == f"{log} line 2: {problem}"


def test_a_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", _garbage(LINES))
    result = verify(log, H3)
    assert (result.ok, result.entries, result.head, result.line) == (False, 1, H1, 2)
    assert result.problem.startswith("not a JSON object (")
    assert result.problem.endswith("): the line was edited or cut")


def test_a_log_cut_mid_line_is_named(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", [*LINES[:2], LINES[2][:20]], end="")
    assert outcome(verify(log, H3)) == (
        False, 2, H2, 3, "the line has no line end: the log was cut mid-line", 0)


def test_a_rewritten_chain_differs_from_the_recorded_lines(tmp_path: Path) -> None:
    # A consistent chain (every hash recomputed) whose second entry is not the one stored.
    other = seal({"at": "y", "action": "rewritten"}, 2, H1)
    third = seal(json.loads(LINES[2]) | {"prev": other["hash"]}, 3, other["hash"])
    log = write(tmp_path / "audit.jsonl", [LINES[0], canonical(other), canonical(third)])
    assert outcome(verify(log, third["hash"], expected_lines=LINES)) == (
        False, 1, H1, 2, "differs from the entry the database recorded: the log was "
        "rewritten from this line on", 0)


def test_lines_removed_from_the_end_are_counted(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", LINES[:2])
    assert outcome(verify(log, H3, expected_lines=LINES)) == (
        False, 2, H2, 3, "the log ends after 2 entries but 3 were recorded: lines were "
        "removed from the end", 0)
    assert outcome(verify(log, H3, expected_entries=3)) == (
        False, 2, H2, 3, "the log ends after 2 entries but 3 were recorded: lines were "
        "removed from the end", 0)


def test_a_chain_that_stops_short_of_the_head_names_both(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", LINES[:2])
    assert outcome(verify(log, H3)) == (
        False, 2, H2, 2, f"the chain is intact but ends at {H2[:16]}, not at the recorded "
        f"head {H3[:16]}: the log was truncated or rewritten", 0)
    empty = write(tmp_path / "empty.jsonl", [])
    assert outcome(verify(empty, H1)) == (
        False, 0, GENESIS, None, f"the chain is intact but ends at {GENESIS[:16]}, not at the "
        f"recorded head {H1[:16]}: the log was truncated or rewritten", 0)


@pytest.mark.parametrize("extra", [1, 2])
def test_lines_past_the_recorded_head_fail_and_are_counted(tmp_path: Path, extra: int) -> None:
    forged = chain(2 + extra)[2:]  # correctly chained continuations of the first two
    log = write(tmp_path / "audit.jsonl", [*LINES[:2], *(canonical(e) for e in forged)])
    problem = (f"{extra} line(s) past the recorded head (entry 2): {PAST_HEAD}; no line after "
               "the recorded head is trusted")
    assert outcome(verify(log, H2)) == (False, 2, H2, 3, problem, extra)
    assert outcome(verify(log, H2, expected_entries=2)) == (False, 2, H2, 3, problem, extra)
    assert outcome(verify(log, H2, expected_lines=LINES[:2])) == (
        False, 2, H2, 3, problem, extra)


def test_any_line_where_nothing_was_recorded_is_past_the_head(tmp_path: Path) -> None:
    log = write(tmp_path / "audit.jsonl", LINES[:1])
    problem = (f"1 line(s) past the recorded head (entry 0): {PAST_HEAD}; no line after the "
               "recorded head is trusted")
    assert outcome(verify(log, GENESIS)) == (False, 0, GENESIS, 1, problem, 1)


def test_the_canonical_form_is_fixed() -> None:
    """Anyone can recompute a hash from the log alone: sorted keys, no spaces, UTF-8 text
    as is (not escaped). A change to that form would break every log already written."""
    assert canonical({"b": 1, "a": "é", "c": [1, 2]}) == '{"a":"é","b":1,"c":[1,2]}'
    body = {k: v for k, v in ENTRIES[0].items() if k != "hash"}
    assert ENTRIES[0]["hash"] == hashlib.sha256(canonical(body).encode()).hexdigest()


@pytest.mark.parametrize("lines", [_garbage(LINES), LINES[:2], [*LINES[:2], LINES[2][:9]]],
                         ids=["garbage", "short", "cut"])
def test_every_failure_names_its_log(tmp_path: Path, lines: list[str]) -> None:
    log = write(tmp_path / "audit.jsonl", lines, end="" if lines[-1] == LINES[2][:9] else "\n")
    for result in (verify(log, H3), verify(log, H3, expected_entries=3), verify(log, H1)):
        assert not result.ok and result.path == log


# ---- AuditTrail.verify: the log checked against the database that recorded it ----------------

def _trail(tmp_path: Path, entries: int = 2):
    from acrb.web.audit import AUDIT_SCHEMA, AuditTrail
    from acrb.web.database import Database

    log = tmp_path / "audit.jsonl"
    log.touch()
    trail = AuditTrail(Database(tmp_path / "tool.sqlite", AUDIT_SCHEMA), log,
                       verify_command="acrb review verify")
    for n in range(entries):
        with trail.database.write() as con:
            trail.append(con, {"action": f"a{n + 1}"})
    return trail


def _append_forged(trail, lines: int) -> None:
    """Correctly chained continuations of the recorded log, written past its head."""
    entries, head = trail.head()
    with open(trail.path, "a") as handle:
        for seq in range(entries + 1, entries + 1 + lines):
            entry = seal({"at": "2026-01-01T00:00:00.000+00:00", "action": "forged"}, seq, head)
            head = entry["hash"]
            handle.write(canonical(entry) + "\n")


def test_a_fresh_trail_with_nothing_recorded_verifies(tmp_path: Path) -> None:
    trail = _trail(tmp_path, entries=0)
    result = trail.verify()
    assert outcome(result) == (True, 0, GENESIS, None, "", 0)
    assert (result.path, result.fix, result.set_aside) == (trail.path, "", [])


def test_a_trail_with_lines_not_yet_set_aside_says_to_reopen_the_tool(tmp_path: Path) -> None:
    trail = _trail(tmp_path)
    _, head = trail.head()
    _append_forged(trail, 2)
    result = trail.verify()
    assert outcome(result) == (False, 2, head, 3, _past(2, 2), 2)
    assert result.fix == ("the lines are still in the log; reopen the tool (any `acrb` "
                          "command on this folder) to set them aside, then verify again")
    assert result.set_aside == []


def _past(lines: int, head_line: int) -> str:
    return (f"{lines} line(s) past the recorded head (entry {head_line}): {PAST_HEAD}; "
            "no line after the recorded head is trusted")


def test_set_aside_lines_are_reported_until_resolved_with_every_side_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import acrb.web.audit as audit

    trail = _trail(tmp_path)
    _, head = trail.head()
    clock = iter([1_000, 2_000])
    monkeypatch.setattr(audit.time, "time", lambda: next(clock))
    _append_forged(trail, 2)
    first = trail.set_aside_lines_past_head()
    _append_forged(trail, 1)
    second = trail.set_aside_lines_past_head()
    assert (first.name, second.name) == ("audit.jsonl.past-head-2-1000",
                                         "audit.jsonl.past-head-2-2000")
    result = trail.verify()
    assert isinstance(result.path, Path) and result.path == trail.path
    assert (result.ok, result.entries, result.head, result.line, result.past_head) == (
        False, 2, head, None, 0)
    assert result.set_aside == [first.name, second.name]
    assert result.problem == (
        f"3 line(s) past the recorded head (entry 2) were set aside, unresolved: {PAST_HEAD}; "
        f"see {first}, {second}")
    assert result.fix == (
        "read the side file: if it is a write that never committed, accept it as set aside "
        "with `acrb review verify --resolve` (logged with its sha256); if nobody here wrote "
        "it, the log was tampered with: keep the file as evidence")
    assert result.message() == f"{trail.path}: {result.problem}"

    trail.resolve_set_aside("alice")
    resolved = trail.verify()
    assert outcome(resolved) == (True, 4, trail.head()[1], None, "", 0)
