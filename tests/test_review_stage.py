"""The review_set and review stages on a tiny judged project: the set, simulated and imported
ratings, refused inputs, the tables, the metrics and the report's part."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from acrb import layout
from acrb.analysis.headline import read_detailed_metrics
from acrb.cli import app
from acrb.errors import InputDataError
from acrb.records import RatingRecord, ReviewItemRecord, read_table, write_table
from acrb.stages import report, review, review_set
from acrb.stages.context import StageContext
from tests.conftest import one_model_project, update_params

MODEL = "synthetic-biased"


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One editor generated, evaluated, judged and analysed once per module."""
    return one_model_project(tmp_path_factory.mktemp("review") / "project", MODEL,
                             judged=True)


@pytest.fixture
def project(judged: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    shutil.copytree(judged, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    return root


def test_simulated_review_end_to_end(project: Path) -> None:
    ctx = StageContext.load(project / "params.yaml", project)
    summary = review_set.run(ctx)
    items = read_table(project / layout.REVIEW_SET, ReviewItemRecord)
    assert summary.random_sample == 60 == int(items["random_sample"].sum())
    assert items["item_id"].is_unique and items["request_id"].is_unique
    verdicts = pd.read_parquet(project / layout.verdicts_table(MODEL))
    flagged = set(verdicts.loc[verdicts["needs_review"], "request_id"])
    assert flagged <= set(items["request_id"])  # every disagreement is in the set
    extra = items[~items["random_sample"]]
    assert extra["needs_review"].all()
    scored = set(verdicts.loc[verdicts["status"] == "scored", "request_id"])
    assert set(items["request_id"]) <= scored  # only judged outputs are rated
    summary_json = json.loads((project / layout.REVIEW_SET_SUMMARY).read_text())
    assert summary_json["prompts_covered"] == summary_json["prompts"] == 50

    result = review.run(ctx)
    folder = project / layout.REVIEW_ANALYSIS_DIR
    for name in review.TABLES:
        assert (folder / f"{name}.parquet").is_file(), name
    ratings = read_table(folder / "ratings.parquet", RatingRecord)
    first = ratings[~ratings["repeat"]]
    assert (first.groupby("item_id")["rater"].nunique() == 3).all()
    assert result.origin.startswith("simulated")
    metrics = read_detailed_metrics(folder / "metrics.csv")
    assert "review.agreement.edit_success.alpha_ordinal" in metrics
    assert f"review.{MODEL}.soft_erasure.delta_race.ppi" in metrics
    headline = project / layout.REVIEW_METRICS_DIR
    soft = json.loads((headline / MODEL / "soft_erasure.json").read_text(),
                      parse_constant=_no_constant)
    assert soft["race"] == round(metrics[f"review.{MODEL}.soft_erasure.delta_race.ppi"], 4)
    edit = json.loads((headline / "agreement" / "edit_success.json").read_text(),
                      parse_constant=_no_constant)
    assert edit["alpha"] == round(metrics["review.agreement.edit_success.alpha_ordinal"], 4)
    rates = pd.read_parquet(folder / "corrected_rates.parquet")
    assert set(rates["estimator"]) == {"judge", "human", "ppi"}
    # Only the random sample is labelled: per model and outcome the labelled counts of the
    # pooled row never exceed it.
    pooled = rates[(rates["dimension"] == "all") & (rates["estimator"] == "ppi")]
    assert (pooled["n_labelled"] <= 60).all() and (pooled["n_labelled"] > 40).all()
    report.run(ctx)
    html = (project / layout.REPORT_FILE).read_text()
    assert 'id="review"' in html and "Judge-corrected race" in html
    assert "simulated raters with planted noise" in html


def test_imported_ratings_are_analysed_and_bad_ones_refused(project: Path) -> None:
    ctx = StageContext.load(project / "params.yaml", project)
    review_set.run(ctx)
    review.run(ctx)
    simulated = read_table(project / layout.REVIEW_ANALYSIS_DIR / "ratings.parquet",
                           RatingRecord)
    ctx = update_params(project, lambda p: p["review"].update({"ratings": "inputs"}))
    with pytest.raises(InputDataError, match="does not exist") as missing:
        review.run(ctx)
    assert "acrb review finalize" in missing.value.fix
    app_ratings = simulated.assign(origin="app", created_at="2026-11-24T10:00:00Z")
    write_table(project / layout.RATINGS_TABLE, app_ratings, RatingRecord)
    result = review.run(ctx)
    assert result.origin == "app" and result.ratings == len(app_ratings)
    stray = app_ratings.iloc[:1].assign(item_id="not-in-the-set", rating_id="x1")
    write_table(project / layout.RATINGS_TABLE, pd.concat([app_ratings, stray]), RatingRecord)
    with pytest.raises(InputDataError, match="not-in-the-set"):
        review.run(ctx)


def test_review_commands_run_the_stages(project: Path) -> None:
    runner = CliRunner()
    sample = runner.invoke(app, ["review", "sample"])
    assert sample.exit_code == 0, sample.output
    assert "drawn at random" in sample.output and "50/50 prompts covered" in sample.output
    analysed = runner.invoke(app, ["review", "analyze"])
    assert analysed.exit_code == 0, analysed.output
    assert "ratings of" in analysed.output


def test_review_without_a_set_says_what_to_run(project: Path) -> None:
    ctx = StageContext.load(project / "params.yaml", project)
    with pytest.raises(InputDataError, match="no review set") as error:
        review.run(ctx)
    assert "acrb review sample" in error.value.fix


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} in a metrics file")
