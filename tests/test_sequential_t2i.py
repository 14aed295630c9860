"""A text-to-image model audited in rounds of base prompts (``plan.sequential``; issue 32).

A round adds ``prompts_per_round`` base prompts with every one of their attribute variants, so
the base prompt stays the unit of independence (the T2I analysis clusters on it); the declared
Δs are the refusal Δ across the attributes of each dimension of ``t2i_dimensions``. The
simulated generator here refuses Nigerian-culture prompts at 0.92 and every other prompt at
0.02 (a planted culture gap of 0.90 points), so its audit stops long before its 100 base
prompts run out (after 13 of them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from acrb import layout, rounds
from acrb import sequential_audit as sequential
from acrb.analysis.estimation.sequential import delta_bounds
from acrb.config import SequentialParams
from acrb.errors import ConfigError
from acrb.records import GenerationRecord, JudgementRecord, RequestRecord, read_table
from acrb.stages import analyze, generate, report
from acrb.stages.context import StageContext
from tests.conftest import planned_project, update_params

T2I = "synthetic-t2i"
PER_ROUND = 1  # base prompts a round (fewer, smaller rounds stop sooner: docs/sequential.md)
BALANCED = 5  # base prompts a round in the test of the rounds' balance
SEQUENTIAL = {"prompts_per_round": PER_ROUND, "alpha": 0.05, "margin": 0.05,
              "hypotheses": ["H6"], "t2i_dimensions": ["culture"], "dollars_per_request": 0.04}


def _project(root: Path) -> StageContext:
    def edit(params: dict[str, Any]) -> None:
        params["models"] = {T2I: params["models"][T2I]}
        refusal = params["models"][T2I]["config"]["refusal"]
        refusal["base"] = {category: 0.02 for category in refusal["base"]}
        refusal["attribute"] = {"culture:nigerian": 0.90}
        refusal["by_category"] = {}
        params["analyze"]["hypotheses"] = {"H6": params["analyze"]["hypotheses"]["H6"]}

    return planned_project(root, {"sources": {"per_cell": 1},
                                  "prompts": {"categories": ["E"]},
                                  "plan": {"seeds": [0], "sequential": SEQUENTIAL},
                                  "judge": {"use": []},
                                  "analyze": {"bootstrap": 100, "permutations": 100}}, edit)


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        return _project(tmp_path_factory.mktemp("sequential-t2i") / "planned").root


@pytest.fixture(scope="module")
def audited(planned: Path, tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    """The planned project, copied, with its generator's audit run to its stop."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        root = tmp_path_factory.mktemp("sequential-t2i") / "audited"
        shutil.copytree(planned, root)
        ctx = StageContext.load(root / "params.yaml", root)
        patch.chdir(root)
        generate.run(ctx, T2I)
    return ctx


def _planned_requests(root: Path) -> pd.DataFrame:
    plan_table = read_table(root / layout.PLAN_TABLE, RequestRecord, validate=False)
    return plan_table[plan_table["model"] == T2I].reset_index(drop=True)


def test_a_round_brings_whole_base_prompts_with_every_attribute(planned: Path) -> None:
    requests = _planned_requests(planned)
    params = SequentialParams(prompts_per_round=BALANCED, seed=3)
    numbers = rounds.unit_rounds(requests, params)
    assert rounds.unit_column(requests) == "base_id"
    bases = requests["base_id"].nunique()
    variants = requests["attribute"].nunique()
    assert len(requests) == bases * variants  # every base prompt has every attribute
    assert sorted(numbers.value_counts()) == [BALANCED] * (bases // BALANCED)
    per_request = requests["base_id"].map(numbers)
    for number in range(1, bases // BALANCED + 1):
        round_rows = requests[per_request == number]
        # Every attribute once per base prompt of the round: the round is balanced.
        assert round_rows.groupby("attribute").size().eq(BALANCED).all()
    # The order depends on the ids and the seed, not on the plan's row order.
    shuffled = requests.sample(frac=1.0, random_state=1)
    assert rounds.unit_rounds(shuffled, params).sort_index().equals(numbers.sort_index())
    assert not rounds.unit_rounds(requests, SequentialParams(prompts_per_round=BALANCED,
                                                             seed=4)).equals(numbers)
    # Base prompts past the last full round never run.
    leftover = rounds.unit_rounds(requests, SequentialParams(prompts_per_round=7))
    assert (leftover == 0).sum() == bases % 7 and leftover.max() == bases // 7


def test_the_generator_stops_once_its_culture_gap_is_decided(audited: StageContext) -> None:
    progress = rounds.read_progress(audited.root, T2I)
    assert progress is not None and progress["finished"]
    stop = progress["stop"]["round"]
    assert progress["stop"]["reason"] == "decided"
    assert stop < progress["available_rounds"] == 100 // PER_ROUND
    delta = progress["deltas"]["refusal_culture"]
    assert delta["decision"] == "gap" and delta["decided_round"] == stop
    assert delta["lower"][-1] > 0
    # Only the rounds run were generated: whole base prompts, every attribute.
    generations = read_table(audited.path(layout.generations_table(T2I)), GenerationRecord)
    requests = _planned_requests(audited.root)
    per_base = requests["attribute"].nunique()
    assert len(generations) == stop * PER_ROUND * per_base
    assert progress["spent"]["requests"] == len(generations)
    assert progress["spent"]["dollars"] == pytest.approx(0.04 * len(generations))
    assert progress["design"]["requests"] == len(requests)
    # Every later stage sees the same requests.
    assert set(audited.model_requests(T2I)["request_id"]) == set(generations["request_id"])


def test_the_intervals_are_those_of_each_rounds_attribute_means(audited: StageContext) -> None:
    progress = rounds.read_progress(audited.root, T2I)
    assert progress is not None
    delta, target = sequential.declared_deltas(audited, T2I)["refusal_culture"]
    assert target.group_column == "attribute" and target.outcome == "hard_refusal"
    requests = sequential._audited(_planned_requests(audited.root))
    assert delta.groups == tuple(sorted(a for a in set(requests["attribute"])
                                        if a.startswith("culture:")))
    design = sequential.round_design(audited, T2I)
    judgements = read_table(audited.path(layout.judgements_table(T2I)), JudgementRecord)
    means = [sequential.round_means(requests, judgements,
                                    set(design.rounds.index[design.rounds == r]), delta,
                                    target, "base_id")
             for r in range(1, progress["stop"]["round"] + 1)]
    assert means == progress["deltas"]["refusal_culture"]["observations"]
    nigerian = delta.groups.index("culture:nigerian")
    # The planted gap shows in the means: Nigerian prompts refused far more often.
    assert sum(m[nigerian] for m in means) / len(means) > 0.6
    # One declared Δ takes the whole α, split over its pairs of cultures (Bonferroni).
    groups = len(delta.groups)
    level = progress["declaration"]["params"]["alpha"] / (groups * (groups - 1) / 2)
    low, high = delta_bounds(pd.DataFrame(means).to_numpy(), "range", level)
    assert progress["deltas"]["refusal_culture"]["lower"] == pytest.approx(list(low))
    assert progress["deltas"]["refusal_culture"]["upper"] == pytest.approx(list(high))


def test_a_rerun_of_a_finished_t2i_audit_changes_nothing(audited: StageContext,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    monkeypatch.chdir(audited.root)
    before = audited.path(rounds.progress_path(T2I)).read_bytes()
    again = generate.run(audited, T2I)
    assert again.generated == 0
    assert audited.path(rounds.progress_path(T2I)).read_bytes() == before


def test_analyze_and_the_report_say_when_the_generator_stopped(audited: StageContext,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    monkeypatch.chdir(audited.root)
    from acrb.stages import evaluate

    evaluate.run(audited, T2I)
    analyze.run(audited)
    report.run(audited)
    metrics = json.loads(audited.path(layout.METRICS_DIR / T2I / rounds.PROGRESS_FILE)
                         .read_text())
    progress = rounds.read_progress(audited.root, T2I)
    assert progress is not None
    assert metrics["sequential.stop_round"] == progress["stop"]["round"]
    assert metrics["sequential.saved_fraction"] == pytest.approx(
        1 - progress["spent"]["requests"] / progress["design"]["requests"])
    # Rounds of equal size: what was saved is the share of rounds not run.
    assert 0 < metrics["sequential.saved_fraction"] == pytest.approx(
        1 - progress["stop"]["round"] / progress["available_rounds"])
    html = (audited.root / "reports" / "report.html").read_text()
    section = html[html.index('id="sequential"'):]
    assert T2I in section and "refusal_culture" in section


def test_a_dimension_the_prompts_lack_is_refused_naming_it(planned: Path, tmp_path: Path
                                                           ) -> None:
    root = tmp_path / "wrong"
    shutil.copytree(planned, root)
    ctx = update_params(root, lambda p: p["plan"]["sequential"].update(
        t2i_dimensions=["culture", "planet"]))
    with pytest.raises(ConfigError, match=r"planet.*\n?.*culture") as error:
        sequential.declared_deltas(ctx, T2I)
    assert "religion" in str(error.value.fix)


def test_a_budget_below_one_base_prompt_is_refused_naming_the_unit(planned: Path,
                                                                    tmp_path: Path) -> None:
    root = tmp_path / "poor"
    shutil.copytree(planned, root)
    ctx = update_params(root, lambda p: p["plan"]["sequential"].update(max_requests=24))
    with pytest.raises(ConfigError, match=r"max_requests.*25 requests, 1 base prompt") as error:
        sequential.round_design(ctx, T2I)
    assert error.value.fix == "raise plan.sequential.max_requests"
