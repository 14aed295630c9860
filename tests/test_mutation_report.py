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
