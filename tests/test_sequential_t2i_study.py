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


def test_the_fixed_designs_test_is_the_t2i_analysis_own(study: ModuleType) -> None:
    """The fixed design's p-value is the one the T2I analysis writes for the culture row of the
    same requests, and its size holds without a gap."""
    import pandas as pd

    from acrb.analysis.experiments.attributes import attribute_disparities

    etas = study.culture_etas(0.10, 0.30, 0.8)
    refused = study.draw_audits(etas, 1, 40, 0.8, np.random.default_rng(1))[0]
    frame = pd.DataFrame([{"base_id": f"b{i:04d}", "attribute": f"culture:{c}",
                           "category": "x", "status": "ok", "hard_refusal": bool(refused[i, j])}
                          for i in range(len(refused)) for j, c in enumerate(study.CULTURES)])
    seed = np.random.SeedSequence(7)
    rows = attribute_disparities(frame, "hard_refusal", n_boot=20, n_perm=300, seed=7)
    # attribute_disparities draws each row's permutation seed from its own spawn tree: the
    # culture row is the second family ("all" first), its permutation seed the second child.
    perm_seed = np.random.SeedSequence(7).spawn(2)[1].spawn(2)[1]
    assert study.fixed_gap_p(refused, 300, perm_seed) == pytest.approx(
        rows.set_index("dimension").loc["culture", "p_value"])
    assert study.fixed_gap_p(refused, 300, seed) < 0.01  # a 30-point gap over 40 base prompts
    same = np.repeat(refused[:, :1], len(study.CULTURES), axis=1)  # no culture differs
    assert study.fixed_gap_p(same, 300, seed) == 1.0
    null = study.draw_audits(study.culture_etas(0.10, 0.0, 0.8), 200, 30, 0.8,
                             np.random.default_rng(2))
    assert study.gap_test_power(null, 30, 200, 3) <= 0.10


def test_the_sequential_budget_is_where_80_percent_have_decided(study: ModuleType) -> None:
    first_gap = np.array([3, 5, 5, 9, 0])  # 0: never within the horizon
    assert study.sized_budget(first_gap, 12) == (9, True)  # 4 of 5 by round 9
    assert study.sized_budget(np.array([3, 0, 0, 0, 0]), 12) == (12, False)


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
        # The 30-point audits are compared with the fixed design sized for 30 points.
        size = result["fixed_designs"]["fixed_gap30"]["base_prompts"]
        row = scenarios["gap30"]
        assert row["saving_vs_own_fixed_design"] == pytest.approx(
            1 - row["median_prompts_used_sized"] / size)
        assert row["median_prompts_used_sized"] <= row["budget_base_prompts"]
        # No gap: compared with the fixed equivalence design, when one fits in the horizon.
        null = scenarios["null"]
        equivalence = result["fixed_designs"]["fixed_equivalence"].get("base_prompts")
        assert null["own_fixed_design"] == "fixed_equivalence"
        if equivalence is None:
            assert null["saving_vs_own_fixed_design"] is None
        else:
            assert null["saving_vs_own_fixed_design"] == pytest.approx(
                1 - null["median_prompts_used_sized"] / equivalence)
        assert set(null["equivalent_by_horizon"]) == {"0.05", "0.1"}
        assert null["own_power_reached"] is (null["own_power_by_budget"]["value"] >= 0.8)
        # a gap's power for its truth is its flag rate by the budget; none of the 20 tiny
        # no-gap audits is shown inside the 5-point margin, so theirs is 0
        for name in ("gap10", "gap30"):
            row = scenarios[name]
            assert row["own_power_by_budget"] == row["gap_flagged_by_budget"]
        assert null["own_power_by_budget"]["value"] == 0.0 and not null["own_power_reached"]
    assert result["fixed_designs"]["fixed_gap30"]["power"] >= 0.8
    text = table.read_text()
    assert "python benchmarks/sequential_t2i_study.py --tiny" in text
    assert text.count("| gap30 |") == 2 * len(study.BOUNDS)
    assert "| 30 pp gap | " in text and "| no gap (equivalence, margin 0.05) |" in text
    # a saving at less than the fixed design's power is printed as an upper bound
    assert study._bound_mark({"own_power_reached": False,
                              "saving_vs_own_fixed_design": -0.2}) == "< "
    assert study._bound_mark({"own_power_reached": True,
                              "saving_vs_own_fixed_design": -0.2}) == ""
    assert study._bound_mark({"own_power_reached": False,
                              "saving_vs_own_fixed_design": None}) == ""


def test_the_fixed_equivalence_design_is_the_t2i_analysis_own(study: ModuleType) -> None:
    """The no-gap design's verdict is the T2I analysis' equivalence row for the culture family
    of the same requests, and it is shown equivalent often at a wide margin, rarely at the
    gap."""
    import pandas as pd

    from acrb.analysis.experiments.attributes import attribute_equivalence

    null = study.draw_audits(study.culture_etas(0.10, 0.0, 0.8), 40, 200, 0.8,
                             np.random.default_rng(4))
    refused = null[0]
    frame = pd.DataFrame([{"base_id": f"b{i:04d}", "attribute": f"culture:{c}",
                           "category": "x", "status": "ok", "hard_refusal": bool(refused[i, j])}
                          for i in range(len(refused)) for j, c in enumerate(study.CULTURES)])
    row = attribute_equivalence(frame, "hard_refusal", 0.15).set_index("dimension")
    design = study.fixed_design(refused)
    from acrb.analysis.experiments.attributes import design_equivalence

    own = design_equivalence(design, design.columns(design.attributes), 0.15, study.ALPHA)
    assert own["p_value"] == pytest.approx(row.loc["culture", "p_value"])
    assert study.equivalence_power(null, 200, 0.15) >= 0.8
    gap = study.draw_audits(study.culture_etas(0.10, 0.15, 0.8), 40, 200, 0.8,
                            np.random.default_rng(5))
    assert study.equivalence_power(gap, 200, 0.15) <= 0.15


def test_the_studys_defaults_are_the_pipelines(study: ModuleType) -> None:
    """The study's margin is plan.sequential.margin's default and the sequential profile's,
    and its equivalence test the one the T2I analysis runs, so its results speak for them."""
    import yaml

    from acrb.analysis.experiments import attributes
    from acrb.config import SequentialParams

    profile = yaml.safe_load((BENCHMARKS.parent / "profiles" / "sequential.yaml").read_text())
    assert SequentialParams.model_fields["margin"].default == study.MARGIN
    assert profile["plan"]["sequential"]["margin"] == study.MARGIN
    assert study.design_equivalence is attributes.design_equivalence
