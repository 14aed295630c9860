"""The mutation report keeps the scores of the modules a run did not check, each with the commit
it was measured on (benchmarks/mutation_report.py: ``make mutation`` or a run of some modules)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def report() -> object:
    pytest.importorskip("mutmut")
    spec = importlib.util.spec_from_file_location(
        "mutation_report", REPO / "benchmarks" / "mutation_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation_report"] = module
    spec.loader.exec_module(module)
    return module


def _row(mutants: int) -> dict[str, object]:
    return {"mutants": mutants, "killed": mutants, "score": 1.0 if mutants else None}


def test_a_module_not_run_keeps_its_last_row_and_that_rows_commit(report: object) -> None:
    modules = {"acrb.redaction": _row(12), "acrb.web.sessions": _row(0)}
    previous = {"commit": "aaa1111", "date": "2026-11-24", "modules": {
        "acrb.web.sessions": {**_row(140), "score": 0.957},
        "acrb.redaction": {**_row(3), "commit": "bbb2222", "date": "2026-11-20"}}}
    merged = report.merge_previous(  # type: ignore[attr-defined]
        modules, previous, {"commit": "ccc3333", "date": "2026-11-28"})
    # Run now: this run's counts and commit, never the old row's.
    assert merged["acrb.redaction"]["mutants"] == 12
    assert merged["acrb.redaction"]["commit"] == "ccc3333"
    # Not run now: the old row, stamped with the report's commit it came from.
    assert merged["acrb.web.sessions"]["mutants"] == 140
    assert merged["acrb.web.sessions"]["score"] == 0.957
    assert (merged["acrb.web.sessions"]["commit"], merged["acrb.web.sessions"]["date"]) == (
        "aaa1111", "2026-11-24")
    # Every module of the scope is listed, in the scope's order; one never measured is absent.
    assert list(merged) == [m for m in report.SCOPES if m in merged]  # type: ignore[attr-defined]
    assert set(merged) == {"acrb.redaction", "acrb.web.sessions"}


def test_globs_of_some_modules_and_an_unknown_module_named(report: object) -> None:
    globs = report.mutant_globs(["acrb.redaction"])  # type: ignore[attr-defined]
    assert globs == ["acrb.redaction.*"]
    everything = report.mutant_globs()  # type: ignore[attr-defined]
    assert "acrb.redaction.*" in everything and "acrb.analysis.tests.pvalues.*" in everything
    with pytest.raises(SystemExit, match=r"not in SCOPES: acrb\.nope"):
        report.mutant_globs(["acrb.nope"])  # type: ignore[attr-defined]


def test_timeouts_are_rechecked_in_a_fresh_process_and_scored_by_that(
        report: object, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A timed-out mutant's tests run again with the mutant switched on as mutmut does: a
    failing test kills it, passing tests make it a survivor, a hang stays a timeout; the
    report then scores the rechecked verdicts, not mutmut's timeouts."""
    import json

    mutants = tmp_path / "mutants"
    (mutants / "tests").mkdir(parents=True)
    (mutants / "src" / "acrb").mkdir(parents=True)
    (mutants / "src" / "probe_path.py").write_text("")
    (mutants / "tests" / "test_probe.py").write_text(
        "import os, time\n"
        "import probe_path  # only on the path when mutants/src is\n"
        "def test_probe():\n"
        "    name = os.environ['MUTANT_UNDER_TEST']\n"
        "    if name.endswith('_3'):\n"
        "        time.sleep(60)\n"
        "    assert not name.endswith('_1')\n")
    mangled = "acrb.redaction.x_redact"
    (mutants / "mutmut-stats.json").write_text(json.dumps(
        {"tests_by_mangled_function_name": {mangled: ["tests/test_probe.py::test_probe"]}}))
    names = [f"{mangled}__mutmut_{n}" for n in (1, 2, 3)] + ["acrb.redaction.x_other__mutmut_1"]
    unrun = f"{mangled}__mutmut_4"  # mutmut did not run it (its tests hang when forked)
    (mutants / "src" / "acrb" / "redaction.py.meta").write_text(json.dumps(
        {"exit_code_by_key": {**{n: 36 for n in names}, "acrb.redaction.x_redact__mutmut_9": 1,
                              unrun: None}}))
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setattr(report, "RECHECK", mutants / "timeout-recheck.json")
    assert report._timeouts() == sorted(names)  # type: ignore[attr-defined]
    verdicts = report.recheck_timeouts(names, limit=6, log=lambda line: None)  # type: ignore[attr-defined]
    assert verdicts == {names[0]: "killed", names[1]: "survived", names[2]: "timeout",
                        names[3]: "no tests"}
    row = report.collect()["acrb.redaction"]  # type: ignore[attr-defined]
    assert (row["killed"], row["survived"], row["timeout"], row["timeouts_rechecked"]) == (
        2, 1, 1, 4)
    assert row["score"] == 0.6  # 2 killed + 1 timeout of 5
    assert row["not_checked"] == 1 and row["run_in_process"] == 0
    # --in-process: the mutant mutmut did not run is run the same way (two at a time here).
    assert report._timeouts(("timeout", "not checked")) == sorted([*names, unrun])  # type: ignore[attr-defined]
    report.recheck_timeouts([unrun, *names], limit=6, log=lambda line: None, workers=2)  # type: ignore[attr-defined]
    row = report.collect()["acrb.redaction"]  # type: ignore[attr-defined]
    assert (row["survived"], row["not_checked"], row["run_in_process"]) == (2, 0, 1)
    # Cached: a second recheck runs nothing (a changed test would otherwise change the verdict).
    (mutants / "tests" / "test_probe.py").write_text("def test_probe():\n    assert False\n")
    assert report.recheck_timeouts(names, limit=10, log=lambda line: None) == verdicts  # type: ignore[attr-defined]
