"""Shared fixtures: a tiny ACRB project in a temporary folder, offline and fast."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from acrb.stages.context import StageContext

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "src" / "acrb" / "prompts" / "data" / "i2i_catalog.yaml"
RUBRIC = REPO / "src" / "acrb" / "judges" / "rubrics" / "acrb-v1.yaml"
FAIRFACE_SAMPLE = REPO.parent / "shared" / "data" / "fairface-sample"
pytest_plugins = ["tests.tiny_pipelines"]  # session fixtures tiny_*_dir: tiny diffusers pipelines

# Never let a test reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Stages run in this process log to MLflow here too (MLflow imported once for the session,
# rather than a logging process per test). The stage processes that DVC starts in
# tests/test_dvc_pipeline.py and the ecosystem tests queue their runs, as a user's do (those
# tests drop ACRB_ variables); tests/test_tracking_queue.py tests the queue.
os.environ.setdefault("ACRB_MLFLOW_BESIDE", "0")


def repo_params() -> dict[str, Any]:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def deep_update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_update(merged[key], value)
        else:
            merged[key] = value
    return merged


#: 2 races x 2 genders x 2 ages = 8 sources at 64 px; all 50 catalog prompts.
TINY = {
    "sources": {"resolution": 64, "races": ["Black", "White"], "genders": ["Female", "Male"],
                "ages": ["20s", "70plus"]},
    "prompts": {"catalog": str(CATALOG),
                "synthesis": {"base_prompts": str(CATALOG.parent / "base_prompts.yaml"),
                              "attributes": str(CATALOG.parent / "attributes.yaml")}},
    "judge": {"rubric": str(RUBRIC)},
    # The proportional-odds fits are the slowest judge analysis; their pipeline path runs in
    # tests/test_default_profile.py and tests/test_analyze_judges.py, their maths in
    # tests/test_judging.py and tests/test_inference.py.
    "analyze": {"ordinal_model": False},
    # A small review: the agreement bootstrap is the review stage's slowest part.
    "review": {"sample_size": 60, "bootstrap": 100},
    # The WinoBias experiment has its own tests (tests/test_winobias.py, WINOBIAS below).
    "winobias": None,
    # The plain arm only: the feature arm needs the features stage's table, which tiny projects
    # do not build unless a test asks for it (tests/test_feature_arm.py).
    "plan": {"arms": ["none"]},
}
#: The WinoBias section of a tiny project, with the embedded files by absolute path.
WINOBIAS = {"sentences": str(CATALOG.parent / "winobias_acrb.yaml"),
            "rubric": str(RUBRIC.parent / "winobias-v1.yaml"), "pairs_per_race": 1}


def update_params(root: Path, update: Callable[[dict[str, Any]], Any]) -> StageContext:
    """Apply ``update`` (a function that edits the params dict in place) to
    ``root/params.yaml`` and load the result."""
    from acrb.stages.context import StageContext

    params = yaml.safe_load((root / "params.yaml").read_text())
    update(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return StageContext.load(root / "params.yaml", root)


def planned_project(root: Path, changes: dict[str, Any],
                    edit: Callable[[dict[str, Any]], Any]) -> StageContext:
    """A tiny project at ``root`` (created) with ``changes`` over the tiny params, then
    ``edit`` applied to the params dict, and its sources, prompts and plan built."""
    from acrb.stages import plan, prompts, sources

    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, changes)
    ctx = update_params(root, edit)
    for stage in (sources, prompts, plan):
        stage.run(ctx)
    return ctx


def one_model_project(root: Path, model: str, *, judged: bool = False, analysed: bool = True,
                      changes: dict[str, Any] | None = None) -> Path:
    """A tiny project at ``root`` (params ``changes`` applied) with only ``model``: planned,
    generated, evaluated and, with ``judged``, judged and (unless not ``analysed``) analysed
    (MLflow off while it runs)."""
    from acrb.stages import analyze, evaluate, generate, judge, plan, prompts, sources

    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, changes)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(root)
        ctx = update_params(root, lambda p: p.update(models={model: p["models"][model]}))
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        generate.run(ctx, model)
        evaluate.run(ctx, model)
        if judged:
            judge.run(ctx, model)
            if analysed:
                analyze.run(ctx)
    return root


def run_pipeline(ctx: StageContext) -> list[Any]:
    """Every stage of dvc.yaml in its order, in process, for every model of ``ctx`` (each one
    judged, as dvc.yaml does); returns the analyze stage's results. MLflow off, ``ctx.root`` as
    the working directory."""
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

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(ctx.root)
        for stage in (sources, prompts, features, plan):
            stage.run(ctx)
        for model in ctx.params.models:  # as dvc.yaml's foreach stages, every model judged
            generate.run(ctx, model)
            evaluate.run(ctx, model)
            judge.run(ctx, model)
        results = analyze.run(ctx)
        for stage in (review_set, review, tables, report):
            stage.run(ctx)
    return results


def write_params(root: Path, changes: dict[str, Any] | None = None) -> Path:
    params = deep_update(deep_update(repo_params(), TINY), changes or {})
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="session", autouse=True)
def _shared_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One pre-screen cache for the candidate folders of this session's curation tests
    (tests/curation_fixtures.py) and one figure cache for the projects analysed in this
    process (acrb.analysis.outputs.figure_cache: most tests analyse the same tiny tables), in the
    session's temporary folder: shared by the xdist workers of one run, never by two runs.
    The stage processes that DVC starts in a test drop ACRB_ variables: they use their
    project's own figure cache, as a user's do."""
    from acrb.analysis.outputs import figure_cache
    from tests import curation_fixtures

    base = tmp_path_factory.getbasetemp()
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    curation_fixtures.PRESCREEN_CACHE = session / "prescreen-cache"
    os.environ.setdefault(figure_cache.CACHE_VARIABLE, str(session / "figure-cache"))


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The worker counts of the process pools a stage starts (tests of its worker processes)."""
    import concurrent.futures

    started: list[int] = []
    real = concurrent.futures.ProcessPoolExecutor

    def counted(workers: int, **kwargs: object) -> concurrent.futures.ProcessPoolExecutor:
        started.append(workers)
        return real(workers, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", counted)
    return started


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder with the tiny params, as the working directory; MLflow off."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    return root


@pytest.fixture(autouse=True)
def _forget_api_keys() -> Any:
    """API keys one test registers for masking (acrb.redaction) mask nothing in the next."""
    yield
    from acrb.redaction import forget_all

    forget_all()


# ---- tests that need something beside the clone: skipped here, required in CI --------------

#: marker -> (is it here?, what is missing, the variable that makes its absence a failure).
#: `.ci/run` sets both variables, so in CI a missing sample or browser fails the suite instead
#: of skipping a whole class of checks unnoticed.
REQUIREMENTS: dict[str, tuple[Callable[[], bool], str, str]] = {
    "real_faces": (FAIRFACE_SAMPLE.is_dir,
                   f"the FairFace sample is not at {FAIRFACE_SAMPLE}", "ACRB_REQUIRE_FAIRFACE"),
    "browser": (lambda: _chromium() is not None,
                "no chromium found: install Debian's `chromium` package (apt-get install "
                "chromium; .ci/run does)", "ACRB_REQUIRE_BROWSER"),
}
#: what the end-of-run line calls each marker's tests.
REQUIREMENT_NAMES = {"real_faces": "real-photo tests", "browser": "browser tests"}


def _chromium() -> str | None:
    from tests.live_server import CHROMIUM

    return CHROMIUM


#: Test files that take minutes (whole pipeline runs, DVC, Ray, browsers), slowest first, as
#: measured by `pytest --durations` (benchmarks/results/test_suite_profile.md). They are
#: collected first, so that `make test`'s two workers (one test file each at a time) start
#: them at once and fill in with the short files, instead of one long file running alone at
#: the end while the other worker idles.
LONG_FILES = ("test_dvc_pipeline.py", "test_default_profile.py", "test_curation.py",
              "test_paper_profile.py", "test_dvc_deps.py", "test_stale_temporaries.py",
              "test_prescreen.py", "test_curation_browser.py", "test_ray_runner.py",
              "test_review_stage.py", "test_t2i.py", "test_curation_web.py",
              "test_mlflow_browser.py", "test_pipeline.py", "test_judge_stage.py",
              "test_pixel_detectors.py", "test_sequential_audit.py",
              "test_sequential_study.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, (present, missing, variable) in REQUIREMENTS.items():
        if item.get_closest_marker(marker) is None or present():
            continue
        if os.environ.get(variable) == "1":
            pytest.fail(f"{missing}, and {variable}=1 says it must be", pytrace=False)
        pytest.skip(f"{missing}: skipped (set {variable}=1 to make this a failure)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per requirement saying how many of its tests ran, so a CI log shows that the
    real-photo and browser tests ran rather than skipped."""
    for marker, name in REQUIREMENT_NAMES.items():
        outcomes: dict[str, set[str]] = {}
        for outcome in ("passed", "failed", "error", "skipped"):
            for report in terminalreporter.stats.get(outcome, []):
                if marker in getattr(report, "keywords", {}):
                    outcomes.setdefault(outcome, set()).add(report.nodeid)
        if not outcomes:
            continue  # none selected (e.g. running one file)
        ran = len(outcomes.get("passed", set()) | outcomes.get("failed", set()))
        counts = ", ".join(f"{len(outcomes.get(o, set()))} {o}"
                           for o in ("passed", "failed", "error", "skipped"))
        terminalreporter.write_line(f"acrb: {name} (marker {marker}): {ran} ran ({counts})")


@pytest.fixture(autouse=True)
def _restore_tracking_uri() -> Any:
    """A test that fails inside an MLflow call leaves MLflow's exported MLFLOW_TRACKING_URI as
    it was before the test, so the next test on the worker does not log to its store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if os.environ.get("MLFLOW_TRACKING_URI") != before:
        import mlflow

        mlflow.set_tracking_uri(before)
