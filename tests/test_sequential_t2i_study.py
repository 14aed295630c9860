"""The text-to-image sequential study (benchmarks/sequential_t2i_study.py): its planted rates
and its quick run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sequential_t2i_study",
                                                  BENCHMARKS / "sequential_t2i_study.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_each_cultures_rate_over_base_prompts_is_its_target(study: ModuleType) -> None:
    """The η solved per culture gives the planted marginal rate once the base-prompt effect is
    averaged out, so the true Δ the coverage is checked against is the planted gap."""
    from simulation_study import marginal_rate

    etas = study.culture_etas(0.10, 0.30, 0.8)
    rates = [marginal_rate(float(eta), 0.8, 0.0) for eta in etas]
    nigerian = study.CULTURES.index("nigerian")
    assert rates[nigerian] == pytest.approx(0.40, abs=1e-6)
    assert np.delete(np.array(rates), nigerian) == pytest.approx([0.10] * 6, abs=1e-6)
    # And the draws have those rates (20,000 base prompts: SE about 0.3 points).
    refused = study.draw_audits(etas, 1, 20_000, 0.8, np.random.default_rng(0))
    assert refused[0].mean(axis=0) == pytest.approx(rates, abs=0.012)


def test_tiny_run_writes_the_report(study: ModuleType, tmp_path: Path) -> None:
    out, table = tmp_path / "t2i.json", tmp_path / "t2i.md"
    result = study.main(["--tiny", "--out", str(out), "--markdown", str(table)])
    assert json.loads(out.read_text())["settings"]["audits"] == 20
    for scenarios in result["bounds"].values():
        assert scenarios["null"]["gap_flagged_by_horizon"]["value"] <= 0.1
        assert scenarios["gap30"]["gap_flagged_by_horizon"]["value"] >= 0.8
        assert all(row["coverage_all_rounds"]["value"] >= 0.9 for row in scenarios.values())
        # A decided 30-point gap uses fewer base prompts than the design.
        assert scenarios["gap30"]["saving_vs_design"] > 0
        assert scenarios["null"]["saving_vs_design"] == 0
    text = table.read_text()
    assert "python benchmarks/sequential_t2i_study.py --tiny" in text
    assert text.count("| gap30 |") == len(study.BOUNDS)
