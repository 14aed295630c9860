"""Stand-ins (`profile.stand_ins`) and the plan's GPU-hour estimate."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from acrb import layout
from acrb.config import STAND_IN_MARK, load_params
from acrb.errors import ConfigError
from acrb.stages import plan, prompts, sources
from tests.conftest import update_params

REAL_EDITORS = {
    "qwen-edit": {"key": "qwen-image-edit", "revision": "abc123"},
    "step1x": {"key": "step1x-edit-v1p2", "revision": "def456"},
}
VLM_JUDGE = {"kind": "vlm", "backend": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                                        "model": "some-vlm"}}


def _with_real_models(params: dict, stand_ins: bool) -> None:
    biased = params["models"]["synthetic-biased"]
    params["models"] = copy.deepcopy(REAL_EDITORS)
    params["judges"]["vlm-judge"] = VLM_JUDGE
    params["judge"]["use"] = ["vlm-judge", "sim-judge-b"]
    params["profile"].update(simulation=False, stand_ins=stand_ins)
    params["stand_ins"] = {
        "models.qwen-edit": biased,
        "models.step1x": {"key": "synthetic:fair", "config": biased["config"]},
        "judges.vlm-judge": params["judges"]["sim-judge-a"],
        "sources": {**params["sources"], "kind": "synthetic"},
    }


def test_stand_ins_replace_the_named_entries_and_mark_the_run_a_simulation(project: Path
                                                                           ) -> None:
    ctx = update_params(project, lambda p: _with_real_models(p, stand_ins=True))
    params = ctx.params
    assert params.models["qwen-edit"].key == "synthetic:biased"
    assert params.models["step1x"].key == "synthetic:fair"
    assert params.judges["vlm-judge"].kind == "simulated"
    assert params.profile.simulation is True
    assert params.report.title.endswith(STAND_IN_MARK)
    # the entry names (DVC stage names) stay those of the real models
    assert set(params.models) == set(REAL_EDITORS)


def test_without_the_flag_the_real_entries_stay(project: Path) -> None:
    ctx = update_params(project, lambda p: _with_real_models(p, stand_ins=False))
    assert ctx.params.models["qwen-edit"].key == "qwen-image-edit"
    assert ctx.params.judges["vlm-judge"].kind == "vlm"
    assert ctx.params.profile.simulation is False
    assert not ctx.params.report.title.endswith(STAND_IN_MARK)


def test_the_params_hash_tells_the_two_runs_apart(project: Path) -> None:
    off = update_params(project, lambda p: _with_real_models(p, stand_ins=False)).params_hash
    on = update_params(project, lambda p: p["profile"].update(stand_ins=True)).params_hash
    assert off != on


@pytest.mark.parametrize("edit, message", [
    (lambda p: p["stand_ins"].pop("models.step1x"), "models.step1x have no stand-in"),
    (lambda p: p["stand_ins"].pop("judges.vlm-judge"), "judges.vlm-judge have no stand-in"),
    (lambda p: p["stand_ins"].update({"models.nope": {"key": "synthetic:fair"}}),
     "stand_ins names models.nope"),
    (lambda p: p["stand_ins"].update({"analyze": {}}), "cannot replace 'analyze'"),
    (lambda p: p.update(stand_ins={}), "lists nothing"),
])
def test_incomplete_or_wrong_stand_ins_are_refused(project: Path, edit, message: str) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    _with_real_models(params, stand_ins=True)
    edit(params)
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=message):
        load_params(project / "params.yaml")


def test_stand_ins_nested_by_section_read_as_the_dotted_ones(project: Path) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    _with_real_models(params, stand_ins=True)
    dotted = load_params_from(project, params)
    nested = copy.deepcopy(params)
    flat = nested["stand_ins"]
    nested["stand_ins"] = {
        "sources": flat["sources"], "prompts": {}, "features": {}, "winobias": {},
        "review": {}, "judges": {"vlm-judge": flat["judges.vlm-judge"]},
        "models": {"qwen-edit": flat["models.qwen-edit"], "step1x": flat["models.step1x"]}}
    def applied(params) -> dict:
        return params.model_dump(exclude={"stand_ins"})

    assert applied(load_params_from(project, nested)) == applied(dotted)
    # Every section empty stands in for nothing.
    nested["stand_ins"] = {name: {} for name in nested["stand_ins"]}
    with pytest.raises(ConfigError, match="lists nothing"):
        load_params_from(project, nested)


def load_params_from(project: Path, params: dict):
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    return load_params(project / "params.yaml")[0]


def test_each_stage_tracks_only_the_stand_ins_it_reads() -> None:
    # A changed stand-in reruns only the stages whose params it replaces: each stage lists
    # stand_ins.<section> for exactly the stand-in sections among its own params.
    from acrb.config import STAND_IN_ENTRY_SECTIONS, STAND_IN_SECTIONS
    from tests.conftest import REPO

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    sections = set(STAND_IN_SECTIONS) | set(STAND_IN_ENTRY_SECTIONS)
    for name, stage in stages.items():
        declared = [str(p) for p in stage.get("do", stage).get("params", [])]
        tracked = {p.split(".", 1)[1] for p in declared if p.startswith("stand_ins.")}
        assert "stand_ins" not in declared, name
        read = {p.split(".", 1)[0] for p in declared} & sections
        if name == "judge":
            read.discard("judge")
        assert tracked == read, (name, tracked, read)
    # Both profiles list every section, so DVC finds each key it tracks.
    for path in (REPO / "params.yaml", REPO / "profiles" / "paper.yaml"):
        assert set(yaml.safe_load(path.read_text())["stand_ins"]) == sections, path


def _planned(project: Path, update) -> plan.PlanSummary:
    ctx = update_params(project, update)
    sources.run(ctx)
    prompts.run(ctx)
    return plan.run(ctx)


def _categories_ab(p: dict) -> None:
    p["prompts"]["categories"] = ["A", "B"]


def test_plan_estimates_gpu_hours_from_recorded_and_measured_seconds(project: Path) -> None:
    def real(p: dict) -> None:
        _categories_ab(p)
        p["models"] = {**copy.deepcopy(REAL_EDITORS),
                       "synthetic-fair": p["models"]["synthetic-fair"]}
        p["models"]["qwen-edit"]["seconds_per_request"] = 36.0

    summary = _planned(project, real)
    by_model = {e.model: e for e in summary.estimates}
    requests = summary.per_model["qwen-edit"]
    assert requests == 8 * 20  # 8 sources x 20 prompts of A and B
    assert by_model["qwen-edit"].gpu_hours == pytest.approx(requests * 36.0 / 3600)
    # Step1X-Edit's recorded figure: about 50 s per edit on one A800
    assert by_model["step1x"].seconds_per_request == 50.0
    assert "A800" in by_model["step1x"].hardware
    assert by_model["synthetic-fair"].simulated and by_model["synthetic-fair"].gpu_hours is None
    assert summary.gpu_hours == pytest.approx(requests * (36.0 + 50.0) / 3600)
    written = json.loads((project / layout.PLAN_SUMMARY).read_text())
    assert written["gpu_hours"] == pytest.approx(summary.gpu_hours)
    assert written["per_model"]["step1x"] == requests


def test_a_real_model_without_a_figure_leaves_the_total_unknown(project: Path) -> None:
    def real(p: dict) -> None:
        _categories_ab(p)
        p["models"] = {"qwen-edit": copy.deepcopy(REAL_EDITORS["qwen-edit"])}

    summary = _planned(project, real)
    assert summary.gpu_hours is None
    assert "seconds_per_request" in summary.estimates[0].describe()
