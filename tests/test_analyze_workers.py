"""How many processes `acrb analyze` uses for the models' analyses (the parallel run's bytes
equal one process's: tests/test_dvc_pipeline.py checks that through DVC)."""

from __future__ import annotations

import os

import pytest

from acrb.errors import ConfigError
from acrb.stages.analyze import analysis_workers


def test_the_cpus_this_process_may_use_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACRB_ANALYZE_WORKERS", raising=False)
    assert analysis_workers() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("value", "workers"), [("3", 3), (" 1 ", 1), ("0", 1), ("-2", 1)])
def test_the_variable_sets_them(monkeypatch: pytest.MonkeyPatch, value: str, workers: int
                                ) -> None:
    monkeypatch.setenv("ACRB_ANALYZE_WORKERS", value)
    assert analysis_workers() == workers


def test_a_value_that_is_no_number_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_ANALYZE_WORKERS", "two")
    with pytest.raises(ConfigError, match="ACRB_ANALYZE_WORKERS is 'two'"):
        analysis_workers()
