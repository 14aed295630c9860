"""`acrb analyze` shares its work among processes: each model's tables, then its judge tables,
each figure, the comparison of the editors and the DVC plots are jobs of one pool. Whatever
process does a job, the outputs are the bytes one process writes; the pool's processes keep
their libraries out of garbage collections and let OpenBLAS's idle threads sleep."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.analysis.outputs.section import build_model_section, section_figure_jobs
from acrb.stages import analyze, evaluate, generate, judge, plan, prompts, sources
from acrb.stages.context import StageContext
from tests.conftest import write_params

MODELS = ("synthetic-biased", "synthetic-t2i")
OUTPUTS = (layout.ANALYSIS_DIR, layout.PLOTS_DIR, layout.METRICS_DIR)


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An editor and a text-to-image model, generated, evaluated and judged (not analysed),
    with few resamples and no ordinal model: this checks who computes what, the statistics
    have their own tests."""
    root = tmp_path_factory.mktemp("pool") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, {"analyze": {"bootstrap": 100, "permutations": 100}})
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {name: params["models"][name] for name in MODELS}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(root)
        ctx = StageContext.load(root / "params.yaml", root)
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        for model in MODELS:
            generate.run(ctx, model)
            evaluate.run(ctx, model)
            judge.run(ctx, model)
    return root


def _digests(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for folder in OUTPUTS for path in sorted((root / folder).rglob("*"))
            if path.is_file()}


# Two analyses of the tiny project, half a minute: tests/test_dvc_pipeline.py checks the same
# through DVC (`dvc repro` with two processes, then `acrb analyze` with one, and `dvc status`
# finds nothing changed); this names the file that differs. Both are among the round trips CI
# runs after `make test` (`make test-ecosystem`).
@pytest.mark.slow
def test_two_processes_write_the_bytes_of_one(judged: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(judged)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    ctx = StageContext.load(judged / "params.yaml", judged)
    alone = analyze.run(ctx, workers=1)
    written = _digests(judged)
    pooled = analyze.run(ctx, workers=2)
    assert _digests(judged) == written
    assert len([name for name in written if name.endswith(".png")]) > 40
    assert any(name.endswith("score_tests.parquet") for name in written)  # judge tables too
    assert [r.model for r in pooled] == [r.model for r in alone] == list(MODELS)
    for one, other in zip(alone, pooled, strict=True):
        # The same metrics, in the same order (judge tables, hypotheses, then the rest).
        assert list(one.metrics) == list(other.metrics)
        assert pd.Series(one.metrics).equals(pd.Series(other.metrics))
        assert (one.judging is None) == (other.judging is None)


def _job_state() -> tuple[str | None, int, str]:
    import matplotlib

    return (os.environ.get("OPENBLAS_THREAD_TIMEOUT"), gc.get_freeze_count(),
            matplotlib.get_backend())


def test_pool_processes_sleep_idle_blas_threads_and_settle_their_heap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    monkeypatch.setenv("MPLBACKEND", "TkAgg")  # a desktop's display backend
    with analyze._job_pool(2) as pool:
        timeout, frozen, backend = pool.submit(_job_state).result()
    assert timeout == analyze.WORKER_BLAS_THREAD_TIMEOUT
    assert frozen > 10_000  # the libraries imported before the first job
    assert backend == "Agg"  # headless, whichever library imports pyplot first
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ  # this process's environment is kept


def test_a_timeout_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "10")
    with analyze._job_pool(2) as pool:
        assert pool.submit(_job_state).result()[0] == "10"
    assert os.environ["OPENBLAS_THREAD_TIMEOUT"] == "10"


def _failing_job() -> None:
    raise ValueError("no rates for outcome 'x'")


def test_a_failing_job_stops_the_pool_with_its_error() -> None:
    with pytest.raises(ValueError, match="no rates for outcome"), \
            analyze._job_pool(2) as pool:
        pool.submit(_failing_job).result()


def _refused_write(path: str) -> None:
    import errno

    raise PermissionError(errno.EACCES, "Permission denied", path)


def test_a_refused_write_in_a_worker_is_the_one_line_error_naming_its_folder(
        tmp_path: Path) -> None:
    """A worker's figure write refused (a read-only folder) reaches `acrb analyze` as the same
    OSError, file name and all, so the CLI's one-line error names the folder."""
    from acrb.errors import file_system_error

    temporary = tmp_path / "plots" / "figures" / ".tmp-heatmap.png"
    with pytest.raises(PermissionError) as caught, analyze._job_pool(2) as pool:
        pool.submit(_refused_write, str(temporary)).result()
    assert caught.value.filename == str(temporary)
    error = file_system_error(caught.value)
    assert error is not None
    assert error.problem == (f"permission denied on the folder {temporary.parent} (cannot "
                             "write or read it)")


def test_one_process_runs_each_job_as_it_is_submitted() -> None:
    with analyze._job_pool(1) as pool:
        future = pool.submit(_job_state)
        assert future.done()
        with pytest.raises(ValueError, match="no rates"):
            pool.submit(_failing_job)


def test_figures_drawn_later_are_the_figures_drawn_at_once(tmp_path: Path) -> None:
    rng = pd.Series(range(240))
    frame = pd.DataFrame({
        "request_id": [f"r{i}" for i in rng],
        "source_id": [f"s{i % 24}" for i in rng],
        "prompt_id": [f"p{i // 24}" for i in rng],
        "category": ["A" if i // 24 < 5 else "B" for i in rng],
        "status": "ok",
        "race": ["Black" if i % 24 < 12 else "White" for i in rng],
        "gender": ["Female" if i % 2 else "Male" for i in rng],
        "age": ["20s" if i % 4 < 2 else "70plus" for i in rng],
        "hard_refusal": [(i * 7) % 10 < (4 if i % 24 < 12 else 2) for i in rng],
    })
    at_once = build_model_section(frame, "m", "k", False, tmp_path / "at-once", bootstrap=50,
                                  permutations=50, tests=False)
    listed = build_model_section(frame, "m", "k", False, tmp_path / "later", bootstrap=50,
                                 permutations=50, tests=False, draw_figures=False)
    assert not (tmp_path / "later").exists()
    assert [f.path.name for f in listed.figures] == [f.path.name for f in at_once.figures]
    drawn = [draw() for draw in section_figure_jobs(listed, tmp_path / "later")]
    assert drawn == [f.path for f in listed.figures]
    for first, later in zip(at_once.figures, listed.figures, strict=True):
        assert first.path.read_bytes() == later.path.read_bytes()
