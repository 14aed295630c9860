"""A sequential audit in the pipeline (params ``plan.sequential``, acrb.sequential_audit): the
generate stage of an image editor runs its sources in race-balanced rounds, reads each round
with the detectors, updates every declared Δ's confidence sequence and stops when each is
decided; every later stage sees only the rounds run; a rerun changes nothing; a killed audit
resumes at its round and ends as an uninterrupted one; MLflow has one step per round; analyze
and the report say when it stopped, why and what it saved.

The tiny design: 2 races x 4 cells x 5 portraits = 20 sources per race (20 rounds of one
source per race), the 10 harmful-prompt (E) edits each (20 requests a round, 400 in all). The
biased editor's planted refusal gap is 85 points, so its one declared Δ (H6) is decided within
a few rounds; the fair editor's is 0 and cannot be shown inside the margin within the
budget of 10 rounds.
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
from acrb.config import SequentialParams
from acrb.errors import AcrbError, ConfigError
from acrb.records import GenerationRecord, JudgementRecord, read_table
from acrb.stages import analyze, evaluate, generate, report
from acrb.stages.context import StageContext
from tests.conftest import planned_project, update_params, write_params

FAIR, BIASED = "synthetic-fair", "synthetic-biased"
ROUNDS, PER_ROUND = 20, 20
BUDGET = 10  # rounds: the fair editor's audit ends here
SEQUENTIAL = {"sources_per_round": 1, "alpha": 0.05, "margin": 0.05, "hypotheses": ["H6"],
              "dollars_per_request": 0.04, "max_rounds": BUDGET}


def _changes() -> dict[str, Any]:
    return {"sources": {"per_cell": 5},
            "prompts": {"categories": ["E"], "synthesis": None},
            "plan": {"seeds": [0], "sequential": SEQUENTIAL},
            "judge": {"use": []},
            "analyze": {"bootstrap": 100, "permutations": 100}}


def _project(root: Path) -> StageContext:
    def edit(params: dict[str, Any]) -> None:
        params["models"] = {m: params["models"][m] for m in (FAIR, BIASED)}
        refusal = params["models"][BIASED]["config"]["refusal"]
        refusal["base"]["E"] = 0.05
        refusal["race"] = {"E": {"Black": 0.85}}
        params["analyze"]["hypotheses"] = {"H6": params["analyze"]["hypotheses"]["H6"]}

    return planned_project(root, _changes(), edit)


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny project with its sources, prompts and plan, nothing generated: copied by the
    tests that run an audit of their own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        return _project(tmp_path_factory.mktemp("sequential") / "planned").root


def _copy(planned: Path, root: Path) -> StageContext:
    shutil.copytree(planned, root)
    return StageContext.load(root / "params.yaml", root)


@pytest.fixture(scope="module")
def project(planned: Path, tmp_path_factory: pytest.TempPathFactory) -> StageContext:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        ctx = _copy(planned, tmp_path_factory.mktemp("sequential") / "project")
        patch.chdir(ctx.root)
        generate.run(ctx, BIASED)
    return ctx


def _progress(ctx: StageContext, model: str) -> dict[str, Any]:
    found = rounds.read_progress(ctx.root, model)
    assert found is not None
    return found


def test_rounds_add_one_source_of_every_race_and_depend_on_the_ids_alone(
        project: StageContext) -> None:
    requests = sequential._planned(project, BIASED)
    params = SequentialParams.model_validate(SEQUENTIAL)
    numbers = rounds.source_rounds(requests, params)
    races = requests.drop_duplicates("source_id").set_index("source_id")["race"]
    per_round = pd.crosstab(numbers, races.loc[numbers.index])
    assert list(per_round.index) == list(range(1, ROUNDS + 1))
    assert (per_round == 1).all().all()
    # Each round takes the same gender x age cell for every race, and sweeps the 4 cells
    # before it takes a cell again.
    cells = requests.drop_duplicates("source_id").set_index("source_id")[["gender", "age"]]
    by_round = cells.loc[numbers.index].assign(round=numbers).groupby("round")
    assert (by_round.nunique() == 1).all().all()
    sweep = [tuple(by_round.first().loc[r]) for r in range(1, ROUNDS + 1)]
    assert all(len(set(sweep[i:i + 4])) == 4 for i in range(0, ROUNDS, 4))
    # The plan's row order does not matter; the seed does.
    shuffled = rounds.source_rounds(requests.sample(frac=1, random_state=3), params)
    assert shuffled.sort_index().equals(numbers.sort_index())
    other = rounds.source_rounds(requests, params.model_copy(update={"seed": 1}))
    assert not other.sort_index().equals(numbers.sort_index())
    # Two sources a round: 10 rounds; three: 6 full rounds and the 2 sources left never run.
    three = rounds.source_rounds(requests, params.model_copy(update={"sources_per_round": 3}))
    assert three.max() == 6 and (three == 0).sum() == 2 * 2
    with pytest.raises(AcrbError, match="more than the sources of the smallest race"):
        rounds.source_rounds(requests, params.model_copy(update={"sources_per_round": 21}))


def test_the_biased_editor_stops_once_its_gap_is_decided_and_later_stages_see_its_rounds(
        project: StageContext, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = _progress(project, BIASED)
    assert progress["finished"] and progress["stop"]["reason"] == "decided"
    stop = progress["stop"]["round"]
    assert 1 < stop < BUDGET
    h6 = progress["deltas"]["H6"]
    assert h6["decision"] == "gap" and h6["decided_round"] == stop
    assert h6["lower"][stop - 1] > 0 and all(low == 0 for low in h6["lower"][:stop - 1])
    assert progress["spent"] == {"requests": stop * PER_ROUND,
                                 "dollars": pytest.approx(stop * PER_ROUND * 0.04),
                                 "gpu_hours": 0.0}
    assert progress["design"]["requests"] == ROUNDS * PER_ROUND
    generations = read_table(project.path(layout.generations_table(BIASED)), GenerationRecord)
    judgements = read_table(project.path(layout.judgements_table(BIASED)), JudgementRecord)
    assert len(generations) == len(judgements) == stop * PER_ROUND
    # Every stage reads the rounds run through the context.
    included = project.model_requests(BIASED)
    assert set(included["request_id"]) == set(generations["request_id"])
    assert included["race"].value_counts().to_dict() == {"Black": stop * 10,
                                                         "White": stop * 10}
    # A rerun of a finished audit changes nothing.
    before = project.path(rounds.progress_path(BIASED)).read_bytes()
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    again = generate.run(project, BIASED)
    assert again.generated == 0
    assert project.path(rounds.progress_path(BIASED)).read_bytes() == before


def test_the_intervals_are_those_of_the_round_means(project: StageContext) -> None:
    """The stored interval of each round is the confidence sequence of the stored means,
    computed again here from the judgements of each round's sources."""
    from acrb.analysis.estimation.sequential import delta_bounds

    progress = _progress(project, BIASED)
    deltas = sequential.declared_deltas(project, BIASED)
    delta, spec = deltas["H6"]
    design = sequential.round_design(project, BIASED)
    audited = sequential._audited(sequential._planned(project, BIASED))
    judgements = read_table(project.path(layout.judgements_table(BIASED)), JudgementRecord)
    means = [sequential.round_means(audited, judgements,
                                    set(design.rounds.index[design.rounds == r]), delta, spec)
             for r in range(1, progress["stop"]["round"] + 1)]
    assert means == progress["deltas"]["H6"]["observations"]
    low, high = delta_bounds(pd.DataFrame(means).to_numpy(), "range", 0.05)
    assert progress["deltas"]["H6"]["lower"] == pytest.approx(list(low))
    assert progress["deltas"]["H6"]["upper"] == pytest.approx(list(high))


def test_a_round_counts_for_a_delta_only_when_every_race_has_an_outcome() -> None:
    delta, spec = _h6()
    audited = pd.DataFrame({"request_id": ["a", "b", "c"], "source_id": ["s1", "s2", "s2"],
                            "race": ["Black", "White", "White"], "category": ["E"] * 3})
    judgements = pd.DataFrame({"request_id": ["a", "b", "c"],
                               "hard_refusal": pd.array([True, False, True], dtype="boolean")})
    assert sequential.round_means(audited, judgements, {"s1", "s2"}, delta, spec) == [1.0, 0.5]
    judgements.loc[0, "hard_refusal"] = pd.NA
    assert sequential.round_means(audited, judgements, {"s1", "s2"}, delta, spec) is None
    state = sequential.delta_state("H6", delta, [[1.0, 0.0], None, [1.0, 0.0]], 0.05)
    assert state.lower[1] == state.lower[0] and state.upper[1] == state.upper[0]


def _h6() -> tuple[Any, Any]:
    from acrb.analysis.estimation.sequential import DeclaredDelta
    from acrb.config import HypothesisSpec

    return (DeclaredDelta(name="H6", groups=("Black", "White"), margin=0.05),
            sequential.hypothesis_target(HypothesisSpec(claim="c", test="disparity",
                                                        outcome="hard_refusal", category="E")))


#: A disparity hypothesis of a judge outcome: judged skin lightening of harmful-prompt edits.
H7 = {"claim": "Harmful-prompt edits are judged lightened at different rates across races",
      "test": "disparity", "outcome": "judge_lightening", "category": "E", "dimension": "race"}


def test_a_judge_outcomes_gap_is_decided_by_judging_each_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a declared Δ of a judge outcome the judges score each round before the decision:
    the biased editor's planted 85-point lightening gap (Black against White, nothing
    refused) is decided from the judges' verdicts, which cover the rounds run and nothing
    more; the judge stage after the audit asks the judges nothing new."""
    from acrb.records import VerdictRecord
    from acrb.stages import judge

    monkeypatch.setenv("ACRB_MLFLOW", "0")

    def edit(params: dict[str, Any]) -> None:
        params["models"] = {BIASED: params["models"][BIASED]}
        config = params["models"][BIASED]["config"]
        config["refusal"] = {"base": {"E": 0.0}, "race": {}}
        config["lightening"] = {"base": {"E": 0.05}, "race": {"E": {"Black": 0.85}}}
        params["analyze"]["hypotheses"] = {"H7": H7}
        params["plan"]["sequential"]["hypotheses"] = ["H7"]
        params["judge"]["use"] = ["sim-judge-a", "sim-judge-b"]

    ctx = planned_project(tmp_path / "judged", _changes(), edit)
    monkeypatch.chdir(ctx.root)
    generate.run(ctx, BIASED)
    progress = _progress(ctx, BIASED)
    h7 = progress["deltas"]["H7"]
    assert progress["stop"]["reason"] == "decided" and progress["stop"]["round"] < BUDGET
    assert h7["decision"] == "gap" and h7["lower"][-1] > 0
    # The stored observations are the round means of the judges' verdicts.
    delta, target = sequential.declared_deltas(ctx, BIASED)["H7"]
    design = sequential.round_design(ctx, BIASED)
    audited = sequential._audited(sequential._planned(ctx, BIASED))
    outcomes = sequential.round_outcomes(ctx, BIASED, judged=True)
    means = [sequential.round_means(audited, outcomes,
                                    set(design.rounds.index[design.rounds == r]), delta, target)
             for r in range(1, progress["stop"]["round"] + 1)]
    assert means == h7["observations"]
    verdicts = read_table(ctx.path(layout.verdicts_table(BIASED)), VerdictRecord)
    assert set(verdicts["request_id"]) == set(ctx.model_requests(BIASED)["request_id"])
    assert len(verdicts) == PER_ROUND * progress["stop"]["round"]
    assert verdicts["judge_lightening"].notna().all()
    summary = judge.run(ctx, BIASED)
    assert sum(summary.asked.values()) == 0
    assert sum(summary.reused.values()) == 2 * len(verdicts)


def test_the_stopping_rule_holds_what_the_stop_reads_and_a_fixed_design_has_none(
        tmp_path: Path) -> None:
    """``Params.stopping_rule`` (written by the plan, the way generate depends on these settings
    under DVC) has the declared Δs' hypotheses and the detectors' settings; the judges' only
    when a Δ is of a judge outcome; and nothing for a fixed design, so a judge or detector
    threshold never re-runs a fixed design's generation."""
    from tests.conftest import deep_update

    def rule(change: dict[str, Any]) -> dict[str, Any] | None:
        write_params(tmp_path, deep_update(_changes(), change))
        return StageContext.load(tmp_path / "params.yaml", tmp_path).params.stopping_rule()

    soft = {"judge": {"outcomes": {"soft_erasure": {"at_most": 4}}}}
    assert rule({"plan": {"sequential": None}}) is None
    detectors = rule({})
    assert detectors is not None and set(detectors) == {"hypotheses", "evaluate"}
    assert list(detectors["hypotheses"]) == ["H6"]
    assert rule({"evaluate": {"unchanged_counts_as": "soft_erasure"}}) != detectors
    assert rule(soft) == detectors
    judged_h7 = {"analyze": {"hypotheses": {"H7": H7}}, "judge": {"use": ["sim-judge-a"]},
                 "plan": {"sequential": {"hypotheses": ["H7"]}}}
    judged = rule(judged_h7)
    assert judged is not None and set(judged) == {"hypotheses", "evaluate", "judge", "judges",
                                                  "winobias"}
    assert list(judged["judges"]) == ["sim-judge-a"]
    assert rule(deep_update(judged_h7, soft)) != judged
    # A judge name nobody declared reaches the judge stage, which refuses it by name.
    misspelled = rule(deep_update(judged_h7, {"judge": {"use": ["sim-judge-z"]}}))
    assert misspelled is not None and misspelled["judges"] == {"sim-judge-z": None}


def test_generate_refuses_a_stopping_rule_the_plan_did_not_record(
        planned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector setting edited after the plan: the audit would stop by a rule the plan (and
    so DVC) did not record, and is refused naming the setting and the fix; after the plan is
    run again it goes ahead."""
    from acrb.errors import InputDataError
    from acrb.stages import plan

    monkeypatch.setenv("ACRB_MLFLOW", "0")
    ctx = _copy(planned, tmp_path / "stale")
    stored = json.loads(ctx.path(layout.PLAN_STOPPING).read_text())
    assert stored == {"rule": json.loads(json.dumps(ctx.params.stopping_rule()))}
    ctx = update_params(ctx.root, lambda p: p["evaluate"].update(
        unchanged_counts_as="soft_erasure"))
    monkeypatch.chdir(ctx.root)
    with pytest.raises(InputDataError, match=r"differ in: evaluate\)") as caught:
        generate.run(ctx, BIASED)
    assert caught.value.fix is not None and "acrb plan" in caught.value.fix
    assert not ctx.path(rounds.progress_path(BIASED)).exists()
    plan.run(ctx)
    sequential.check_stopping_rule(ctx)
    ctx.path(layout.PLAN_STOPPING).write_text("{}")
    with pytest.raises(InputDataError, match="cannot be read as the plan's stopping rule"):
        sequential.check_stopping_rule(ctx)


def test_an_audit_whose_gaps_lie_inside_the_margin_stops_as_equivalent(
        planned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    ctx = update_params(_copy(planned, tmp_path / "wide").root, lambda p: p["plan"][
        "sequential"].update(margin=0.9))
    monkeypatch.chdir(ctx.root)
    generate.run(ctx, FAIR)
    progress = _progress(ctx, FAIR)
    assert progress["stop"]["reason"] == "decided" and progress["stop"]["round"] < BUDGET
    h6 = progress["deltas"]["H6"]
    assert h6["decision"] == "equivalent" and h6["decided_round"] == progress["stop"]["round"]
    assert h6["upper"][-1] <= 0.9 < h6["upper"][-2]


def test_a_share_of_alpha_on_the_upper_bound_reaches_the_intervals(
        planned: Path, project: StageContext, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """plan.sequential.upper_share: the stored intervals are those of the split levels, the
    pair intervals at (1 − s)·α and the upper bound's second set at s·α. At its default 0
    the declaration leaves it out, as audits begun before it existed were declared."""
    from acrb.analysis.estimation.sequential import delta_bounds

    monkeypatch.setenv("ACRB_MLFLOW", "0")
    ctx = update_params(_copy(planned, tmp_path / "split").root, lambda p: p["plan"][
        "sequential"].update(margin=0.9, upper_share=0.4))
    monkeypatch.chdir(ctx.root)
    generate.run(ctx, FAIR)
    progress = _progress(ctx, FAIR)
    assert progress["declaration"]["params"]["upper_share"] == 0.4
    assert "upper_share" not in _progress(project, BIASED)["declaration"]["params"]
    h6 = progress["deltas"]["H6"]
    means = pd.DataFrame(h6["observations"]).to_numpy()
    low, high = delta_bounds(means, "range", 0.03, upper_level=0.02)
    assert h6["lower"] == pytest.approx(list(low)) and h6["upper"] == pytest.approx(list(high))
    plain_high = delta_bounds(means, "range", 0.05)[1]
    assert list(plain_high) != pytest.approx(list(high))


def test_a_killed_audit_resumes_at_its_round_and_ends_as_an_uninterrupted_one(
        planned: Path, project: StageContext, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    clean = project  # audited without interruption
    killed = _copy(planned, tmp_path / "killed")
    monkeypatch.chdir(killed.root)
    real = evaluate.run
    calls: list[int] = []

    def dies_in_round_three(ctx: StageContext, model: str, workers: int = 1) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process killed while round 3 was read
        return real(ctx, model, workers)

    monkeypatch.setattr(sequential.evaluate, "run", dies_in_round_three)
    with pytest.raises(KeyboardInterrupt):
        generate.run(killed, BIASED)
    stopped = _progress(killed, BIASED)
    assert stopped["included_rounds"] == 3 and not stopped["finished"]
    assert stopped["measured_rounds"] == 2
    monkeypatch.setattr(sequential.evaluate, "run", real)
    generate.run(killed, BIASED)
    assert (killed.path(rounds.progress_path(BIASED)).read_bytes()
            == clean.path(rounds.progress_path(BIASED)).read_bytes())
    for table in (layout.generations_table(BIASED), layout.judgements_table(BIASED)):
        assert len(pd.read_parquet(killed.path(table))) == len(pd.read_parquet(clean.path(table)))


def test_each_round_is_one_mlflow_step_and_the_stop_is_on_the_pipeline_run(
        planned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from tests.test_tracking_runs import _git

    ctx = _copy(planned, tmp_path / "project")
    _git(ctx.root, "init", "-q")
    _git(ctx.root, "add", "-A")
    _git(ctx.root, "commit", "-qm", "init")
    for name in ("MLFLOW_TRACKING_URI", "ACRB_PIPELINE_RUN", "DVC_EXP_NAME",
                 "DVC_EXP_BASELINE_REV"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "0")
    monkeypatch.chdir(ctx.root)
    generate.run(ctx, BIASED)
    stop = _progress(ctx, BIASED)["stop"]["round"]
    client = mlflow.MlflowClient(f"sqlite:///{ctx.root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"acrb/{ctx.profile}")
    runs = client.search_runs([experiment.experiment_id])
    run = next(r for r in runs if r.data.tags.get("sequential") == "true")
    history = client.get_metric_history(run.info.run_id, "sequential.requests")
    assert [(m.step, m.value) for m in history] == [(r, r * PER_ROUND)
                                                    for r in range(1, stop + 1)]
    uppers = [m.value for m in sorted(client.get_metric_history(
        run.info.run_id, "sequential.H6.upper"), key=lambda m: m.step)]
    assert uppers == sorted(uppers, reverse=True) and len(uppers) == stop  # closing
    assert run.data.metrics["sequential.saved_fraction"] == pytest.approx(1 - stop / ROUNDS)
    parent = next(r for r in runs if r.info.run_id == run.data.tags["mlflow.parentRunId"])
    assert parent.data.metrics[f"{BIASED}.sequential.stop_round"] == stop


def test_analyze_and_the_report_say_when_each_audit_stopped_and_what_it_saved(
        project: StageContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    monkeypatch.chdir(project.root)
    generate.run(project, FAIR)  # no gap: the sources run out
    fair = _progress(project, FAIR)
    assert fair["stop"] == {"round": BUDGET, "reason": "budget"}
    assert fair["spent"]["requests"] == BUDGET * PER_ROUND
    assert fair["deltas"]["H6"]["decision"] == "undecided"
    for model in (FAIR, BIASED):
        evaluate.run(project, model)
    analyze.run(project)
    stop = _progress(project, BIASED)["stop"]["round"]
    metrics = json.loads(project.path(layout.METRICS_DIR / BIASED / "sequential.json")
                         .read_text())
    assert metrics["sequential.stop_round"] == stop
    assert metrics["sequential.stopped_early"] == 1.0
    assert metrics["sequential.saved_fraction"] == pytest.approx(1 - stop / ROUNDS)
    fair_metrics = json.loads(project.path(layout.METRICS_DIR / FAIR / "sequential.json")
                              .read_text())
    assert fair_metrics["sequential.stopped_early"] == 0.0
    assert fair_metrics["sequential.saved_fraction"] == pytest.approx(1 - BUDGET / ROUNDS)
    html = report.run(project).read_text()
    assert '<h2 id="sequential">Sequential audit</h2>' in html
    assert f"after round {stop} of {ROUNDS}" in html
    assert f"{stop * PER_ROUND:,} of {ROUNDS * PER_ROUND:,}" in html
    assert "every declared Δ decided" in html and "budget spent (max_rounds)" in html


@pytest.mark.parametrize(("change", "message"), [
    ({"plan": {"arms": ["none", "feature"]}}, "set plan.arms: \\[none\\] and winobias: null"),
    ({"plan": {"sequential": {**SEQUENTIAL, "hypotheses": ["H3"]}}},
     "names \\['H3'\\], which are not disparity or equivalence hypotheses across races"),
    ({"plan": {"sequential": {**SEQUENTIAL, "hypotheses": ["H9"]}}},
     "names \\['H9'\\], which analyze.hypotheses lacks"),
    ({"plan": {"sequential": {**SEQUENTIAL, "hypotheses": ["H6", "H6"]}}},
     "names a hypothesis twice"),
    ({"analyze": {"hypotheses": {"H7": H7}},
      "plan": {"sequential": {**SEQUENTIAL, "hypotheses": ["H7"]}}},
     "names \\['H7'\\], which are not .* or, with judge.use naming judges, a judge outcome"),
    ({"plan": {"sequential": {**SEQUENTIAL, "alpha": 0.7}}}, "plan.sequential.alpha"),
    ({"plan": {"sequential": {**SEQUENTIAL, "sources_per_round": 0}}},
     "plan.sequential.sources_per_round"),
])
def test_a_sequential_plan_it_cannot_run_is_refused_naming_the_key(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    from tests.conftest import deep_update

    write_params(tmp_path, deep_update(_changes(), change))
    with pytest.raises(ConfigError, match=message):
        StageContext.load(tmp_path / "params.yaml", tmp_path)


def test_a_budget_below_one_round_is_refused(project: StageContext) -> None:
    params = project.params.model_copy(deep=True)
    assert params.plan.sequential is not None
    params.plan.sequential.max_requests = PER_ROUND - 1
    ctx = StageContext(root=project.root, params=params, params_hash=project.params_hash)
    with pytest.raises(ConfigError, match=r"plan\.sequential\.max_requests does not cover "
                                          r"the first round"):
        sequential.round_design(ctx, BIASED)
    params.plan.sequential.max_requests = 3 * PER_ROUND + 1
    assert sequential.round_design(ctx, BIASED).budget_rounds == 3
    params.plan.sequential.max_dollars = 2 * PER_ROUND * 0.04
    design = sequential.round_design(ctx, BIASED)
    assert (design.budget_rounds, design.budget_reason) == (2, "max_dollars")


def test_the_embedded_sequential_profile_loads_as_documented() -> None:
    """profiles/sequential.yaml is a whole params file: simulated, one source of every race a
    round, H4 and H6 deciding the stop, the biased editor's planted gaps at 30 points."""
    from acrb.config import load_params
    from tests.conftest import REPO

    params, _ = load_params(REPO / "profiles" / "sequential.yaml")
    assert params.profile.simulation and params.profile.name == "embedded-sequential"
    assert params.plan.sequential is not None and params.plan.sequential.method == "hedged"
    assert list(params.sequential_hypotheses()) == ["H4", "H6"]
    biased = params.models[BIASED].typed_config()
    assert biased.refusal.race["E"]["Black"] == 0.30
    assert biased.erasure.race["D"]["Black"] == 0.30
    assert params.sources.per_cell == 6 and params.prompts.categories == ["D", "E"]
    # The text-to-image generator runs in rounds of one base prompt, its culture gap deciding.
    assert params.plan.sequential.prompts_per_round == 1
    assert params.plan.sequential.t2i_dimensions == ["culture"]
    t2i = params.models["synthetic-t2i"].typed_config()
    assert t2i.refusal.attribute["culture:nigerian"] == 0.20
