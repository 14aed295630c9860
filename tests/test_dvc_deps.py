"""dvc.yaml declares every file each stage uses, and nothing it does not.

The stages run in process on a tiny project while the files they open are traced (see
``tests/dvc_deps.py``); their code is the static import closure of the stage module plus the
adapters the registry loaded. Both must be covered by the stage's declared ``deps``, and a
stage writes only inside its declared outputs. The converse is checked too: removing any one
declared dependency must make the check fail, so every declared dependency is one a stage
needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from acrb.stages import (
    analyze,
    evaluate,
    features,
    generate,
    judge,
    plan,
    prompts,
    report,
    review,
    review_set,
    sources,
    tables,
)
from acrb.stages.context import StageContext
from tests import dvc_deps
from tests.conftest import WINOBIAS, write_params

STAGES = dvc_deps.load_stages()
#: Declared dependencies the tiny embedded run does not open, with the params that use them.
NEEDED_ELSEWHERE = {
    ("sources", "inputs"): "the curated FairFace set, read when sources.kind is fairface",
    ("review", "inputs/review"): "people's ratings, read when review.ratings is inputs",
    ("prompts", "inputs/study"): "the study's imported catalog, read when prompts.catalog "
                                 "points there",
    ("prompts", "src/acrb/clients"): "the LLM writer's chat client, loaded by the registry when "
                                     "prompts.synthesis.backend names one",
    ("features", "inputs/study"): "the study's feature mapping, read when features.describer "
                                  "is mapping",
    ("plan", "inputs/study"): "the study's WinoBias pairs, read when winobias.study_file is set",
    ("plan", "data/features"): "the feature prompts, read when plan.arms has feature",
    ("analyze", "data/generations"): "each editor's rounds (sequential.json), read when "
                                     "plan.sequential is set",
    ("tables", "data/generations"): "each editor's rounds (sequential.json), read when "
                                    "plan.sequential is set",
    # A foreach stage declares one set of deps for every model: a text-to-image model's
    # generate and evaluate have no source images to read, the editors' stages do.
    ("generate@synthetic-t2i", "data/sources"): "the source images, which only editors get",
    ("evaluate@synthetic-t2i", "data/sources"): "the source images, which only editors have",
    ("judge@synthetic-t2i", "data/sources"): "the source images, which only editors' judges see",
}
RUNNERS: dict[str, Callable[..., object]] = {
    "sources": sources.run, "prompts": prompts.run, "features": features.run, "plan": plan.run,
    "generate": generate.run, "evaluate": evaluate.run, "judge": judge.run,
    "analyze": analyze.run, "review_set": review_set.run, "review": review.run,
    "report": report.run, "tables": tables.run,
}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dvc_deps.Trace]]:
    """Run every stage of dvc.yaml in order on a tiny project, tracing each one."""
    root = tmp_path_factory.mktemp("deps") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    # Every stage's code and files, not its statistics: few resamples, and the text-to-image
    # prompts of two of the nine safety domains (550 instead of 2,500).
    write_params(root, {"analyze": {"bootstrap": 200, "permutations": 200},
                        "prompts": {"synthesis": {"domains": ["copyright",
                                                              "religious-cultural"]}},
                        "winobias": WINOBIAS})
    traces: dict[str, dvc_deps.Trace] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("ACRB_MLFLOW", "0")
        ctx = StageContext.load(root / "params.yaml", root)
        for name, stage in STAGES.items():
            run = RUNNERS[stage.command]
            model = name.partition("@")[2]
            with dvc_deps.tracing(patch) as trace:
                run(ctx, model) if model else run(ctx)
            traces[name] = trace
    return root, traces


def _used(name: str, root: Path, traces: dict[str, dvc_deps.Trace]) -> set[str]:
    stage, trace = STAGES[name], traces[name]
    return dvc_deps.code_used(stage, trace.loaded) | dvc_deps.data_used(trace, root, stage)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_declares_what_it_uses(
        name: str, traced: tuple[Path, dict[str, dvc_deps.Trace]]) -> None:
    root, traces = traced
    missing = dvc_deps.missing(STAGES[name], _used(name, root, traces))
    assert not missing, (f"dvc.yaml stage '{name}' uses paths no dependency declares: "
                         f"{missing}; add them (or a folder above them) to its deps")


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_writes_only_its_outputs(
        name: str, traced: tuple[Path, dict[str, dvc_deps.Trace]]) -> None:
    root, traces = traced
    stray = dvc_deps.writes_outside_outs(STAGES[name], traces[name], root)
    assert not stray, f"stage '{name}' wrote outside its declared outs: {stray}"


@pytest.mark.parametrize(("name", "dep"), [(n, d) for n, s in sorted(STAGES.items())
                                          for d in s.deps])
def test_removing_a_declared_dependency_is_caught(
        name: str, dep: str, traced: tuple[Path, dict[str, dvc_deps.Trace]]) -> None:
    root, traces = traced
    for key in ((name.partition("@")[0], dep), (name, dep)):
        if key in NEEDED_ELSEWHERE:
            pytest.skip(NEEDED_ELSEWHERE[key])
    stage = STAGES[name]
    fewer = dvc_deps.Stage(name=stage.name, command=stage.command, outs=stage.outs,
                           deps=tuple(d for d in stage.deps if d != dep))
    assert dvc_deps.missing(fewer, _used(name, root, traces)), (
        f"removing '{dep}' from stage '{name}' goes unnoticed: the stage does not use it")


def test_import_walk_follows_function_level_and_relative_imports() -> None:
    # The report stage imports the analysis package's renderer; a lazy import inside a
    # function body must count, a TYPE_CHECKING-only import must not.
    closure = dvc_deps.import_closure("acrb.stages.report")
    assert "acrb.analysis.outputs.report" in closure
    assert "acrb" in closure and "acrb.stages" in closure
    assert "acrb.cli" not in closure


def test_coverage_is_by_path_prefix_only() -> None:
    assert dvc_deps.covered("src/acrb/analysis/outputs/report.py", ["src/acrb/analysis"])
    assert dvc_deps.covered("data/plan/requests.parquet", ["data/plan/"])
    assert not dvc_deps.covered("src/acrb/analysis_extra.py", ["src/acrb/analysis"])
    assert not dvc_deps.covered("data/plans", ["data/plan"])
