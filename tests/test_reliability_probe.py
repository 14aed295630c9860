"""benchmarks/reliability_probe.py: its bad-input cases pass through the real CLI, and a case
whose command exits 0 is reported as a failure (a refusal that did not happen)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def _probe() -> ModuleType:
    name = "reliability_probe"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project the probe builds, without any run: what imports and params refused at
    load need."""
    return _probe().code_only_project(tmp_path_factory.mktemp("probe") / "acrb")


CHEAP = ["study-huge-number", "study-deep-nesting", "survey-huge-number",
         "params-plan-seed-1e30"]


def test_the_cheapest_bad_inputs_are_refused(base: Path, tmp_path: Path) -> None:
    results = _probe().run_bad_inputs(base, tmp_path, names=CHEAP)
    assert [r.name for r in results] == CHEAP
    assert [r.status for r in results] == ["pass"] * len(CHEAP), \
        "\n".join(f"{r.name}: {r.observed}" for r in results)
    assert all(r.category == "bad-inputs" and r.observed.startswith("exit 2; error: ")
               for r in results)


def test_a_command_that_accepts_the_input_is_a_failure(base: Path, tmp_path: Path) -> None:
    probe = _probe()
    planted = [probe.BadInput("planted-true", "`true` in place of a refusal", ["true"],
                              ("anything",)),
               probe.BadInput("planted-no-name", "the error names something else",
                              ["sh", "-c", "echo 'error: something else' >&2; exit 2"],
                              ("plan.seeds",)),
               probe.BadInput("planted-writes-outside", "a refusal that writes beside the "
                              "project", ["sh", "-c", "touch ../home/x; echo 'error: "
                                          "plan.seeds' >&2; exit 2"], ("plan.seeds",)),
               probe.BadInput("planted-traceback", "a refusal with a traceback",
                              ["sh", "-c", "echo 'Traceback (most recent call last):' >&2; "
                                           "echo 'error: plan.seeds' >&2; exit 2"],
                              ("plan.seeds",))]
    results = probe.run_bad_inputs(base, tmp_path, cases=planted)
    assert [r.status for r in results] == ["fail"] * 4
    true, no_name, outside, traceback = (r.observed for r in results)
    assert "exit 0: the input was accepted" in true
    assert "no line starting 'error:' holding ['plan.seeds']" in no_name
    assert "written outside the project: ['home/x']" in outside
    assert "a Traceback was printed" in traceback


def test_the_record_counts_failures() -> None:
    probe = _probe()
    results = [probe.Result("a", "kills", "", "", "", "pass"),
               probe.Result("b", "kills", "", "", "", "fail"),
               probe.Result("c", "secrets", "", "", "", "skip")]
    assert probe.summary(results) == {"kills": {"pass": 1, "fail": 1, "skip": 0},
                                      "secrets": {"pass": 0, "fail": 0, "skip": 1}}
