"""The sequential-audit simulation study (benchmarks/sequential_study.py): its quick run, and
that its fixed-design reference runs the pipeline's own test."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from acrb.analysis.estimation.resampling import group_test_p, prepare_block

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sequential_study.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sequential_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_the_report(study: ModuleType, tmp_path: Path) -> None:
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    result = study.main(["--tiny", "--out", str(out), "--markdown", str(md)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["settings"]["audits"] == 40 and result["settings"]["horizon_rounds"] == 60
    (label, bound), = result["bounds"].items()
    assert label == "hedged, c = 3/4"
    rows = bound["scenarios"]
    for row in rows.values():
        assert 0.0 <= row["coverage_all_rounds"]["value"] <= 1.0
        # Covering every pair at every round implies covering Δ at every round.
        assert row["coverage_all_rounds"]["value"] >= row["pair_coverage_all_rounds"]["value"]
        assert row["coverage_until_stop"]["value"] >= row["coverage_all_rounds"]["value"]
    assert rows["null"]["catalog_delta_mean"] == 0.0
    assert rows["null"]["gap_flagged_by_horizon"]["value"] <= 0.05
    # 30 pp is found well within 60 rounds; the fixed test needs far fewer sources for it
    # than for 10 pp.
    assert rows["gap30"]["stop_gap_share"]["value"] >= 0.9
    fixed = result["fixed_designs"]
    assert fixed["fixed_gap30"]["sources_per_race"] < fixed["fixed_gap10"]["sources_per_race"]
    assert set(bound["targets"]) >= {"coverage_met", "null_flags_met", "saving_met"}
    text = md.read_text()
    assert "python benchmarks/sequential_study.py --tiny" in text
    assert "| hedged, c = 3/4 | gap30 |" in text


def test_fixed_block_is_the_pipelines_block(study: ModuleType) -> None:
    """The fixed design's test runs on blocks built directly from the rounds; the pipeline's
    ``prepare_block`` on the same requests gives the same statistic and the same strata."""
    rng = np.random.default_rng(5)
    refused = rng.random((6, 7, study.PROMPTS)) < 0.2  # 6 sources per race
    direct = study.fixed_block(refused)
    frame = study.design(tuple(study.AGES[:3]))
    # design() lists each race's sources gender by gender, age by age; fixed_block gives
    # round t gender t % 2 and age t // 2, so reorder the rounds to match.
    order = [0, 2, 4, 1, 3, 5]
    frame["hard_refusal"] = np.transpose(refused[order], (1, 0, 2)).reshape(-1)
    block = prepare_block(frame, "hard_refusal", "race")
    assert block.groups == direct.groups
    np.testing.assert_array_equal(np.sort(block.y.sum(axis=1)), np.sort(direct.y.sum(axis=1)))
    ours = group_test_p(direct, "between-groups", 200, 1)
    theirs = group_test_p(block, "between-groups", 200, 1)
    assert ours.observed == pytest.approx(theirs.observed)
    assert ours.stratified and theirs.stratified and ours.n_strata == theirs.n_strata


def test_tiny_run_of_the_asymptotic_bound_with_and_without_its_guard(study: ModuleType,
                                                                     tmp_path: Path) -> None:
    md = tmp_path / "s.md"
    result = study.main(["--tiny", "--bounds", "asymptotic, t_opt = 30", "asymptotic, no guard",
                         "--markdown", str(md)])
    guarded, bare = (result["bounds"][k] for k in ("asymptotic, t_opt = 30",
                                                   "asymptotic, no guard"))
    assert guarded["method"] == bare["method"] == "asymptotic"
    assert guarded["options"]["prior_rounds"] == 1.0 and bare["options"]["prior_rounds"] == 0.0
    for name, row in guarded["scenarios"].items():
        through = row["coverage_through_round"]
        assert list(through) == ["1", "5", "10", "20", "30", "50"]
        # Coverage through round t can only fall with t, and ends at the time-uniform share.
        values = [through[k]["value"] for k in through]
        assert values == sorted(values, reverse=True)
        assert values[-1] == row["coverage_all_rounds"]["value"]
        if name != "null":
            assert row["stop_gap_share"]["value"] > 0.5
    # Without the variance guard round 1's interval is a point: Δ is missed at once.
    assert all(row["coverage_through_round"]["1"]["value"] < 0.5
               for row in bare["scenarios"].values())
    assert not bare["targets"]["coverage_met"]
    text = md.read_text()
    assert "| asymptotic, t_opt = 30 | gap30 |" in text and "Coverage of Δ through round t" in text
