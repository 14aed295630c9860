"""A run killed while it wrote a table leaves a temporary file (``.tmp-*``) beside it. A rerun
by command (DVC empties the outputs of a stage it reruns, unless they persist) removes it before
it writes, so the temporary is neither read (MLflow's artifact step used to read it, and crashed
on an empty Parquet file) nor cached by DVC as an output."""

from __future__ import annotations

from pathlib import Path

import pytest

from acrb import layout
from acrb.stages import analyze, judge, review, review_set, tables
from acrb.stages.context import StageContext
from acrb.storage import TMP_PREFIX
from tests.conftest import one_model_project

MODEL = "synthetic-biased"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Judged, not analysed: the first test's analyze is the one run it needs (review, review_set
    # and tables read the verdicts, not the analysis).
    return one_model_project(tmp_path_factory.mktemp("stale") / "project", MODEL, judged=True,
                             analysed=False)


def _leave_temporaries(root: Path, folders: list[Path]) -> list[Path]:
    left = []
    for folder in folders:
        path = root / folder / f"{TMP_PREFIX}killed.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")  # what a kill before the first byte leaves
        left.append(path)
    return left


def test_analyze_and_judge_remove_what_a_killed_run_left(
        analysed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(analysed)
    monkeypatch.setenv("ACRB_MLFLOW", "1")  # the artifact step that read the temporary
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{analysed / 'mlflow.db'}")
    ctx = StageContext.load(analysed / "params.yaml", analysed)
    # metrics/ itself too: metrics/headline.json is written there.
    left = _leave_temporaries(analysed, [layout.ANALYSIS_DIR / MODEL, layout.PLOTS_DIR,
                                         layout.METRICS_DIR, layout.METRICS_DIR.parent,
                                         layout.SCORES_DIR / MODEL])
    judge.run(ctx, MODEL)
    analyze.run(ctx)
    assert not [path for path in left if path.exists()]


def test_review_and_tables_remove_what_a_killed_run_left(
        analysed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(analysed)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    ctx = StageContext.load(analysed / "params.yaml", analysed)
    left = _leave_temporaries(analysed, [layout.REVIEW_SET_DIR, layout.REVIEW_ANALYSIS_DIR,
                                         layout.TABLES_DIR])
    review_set.run(ctx)
    review.run(ctx)
    tables.run(ctx)
    assert not [path for path in left if path.exists()]
