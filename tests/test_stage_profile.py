"""benchmarks/stage_profile.py reads the stages and their seconds from what `dvc repro` prints."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO


def _module():
    spec = importlib.util.spec_from_file_location("stage_profile",
                                                  REPO / "benchmarks" / "stage_profile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_announced_stage_gets_the_time_until_the_next() -> None:
    script = ("import time\n"
              "print(\"Running stage 'sources':\", flush=True); time.sleep(0.3)\n"
              "print('> acrb sources', flush=True)\n"
              "print(\"Running stage 'generate@synthetic-fair':\", flush=True); time.sleep(0.1)\n")
    times = _module().profile([sys.executable, "-c", script])
    assert list(times) == ["sources", "generate@synthetic-fair", "total"]
    assert times["sources"] >= 0.3 > times["generate@synthetic-fair"] >= 0.1
    assert times["total"] >= times["sources"] + times["generate@synthetic-fair"] - 0.1


def test_a_failed_repro_stops_the_profile() -> None:
    with pytest.raises(SystemExit, match="exit code 3"):
        _module().profile([sys.executable, "-c", "raise SystemExit(3)"])
