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
from acrb.analysis.outputs.headline import read_detailed_metrics
from acrb.cli import app
from acrb.errors import InputDataError
from acrb.records import (
    RatingRecord,
    RequestRecord,
    ReviewItemRecord,
    VerdictRecord,
    read_table,
    write_table,
)
from acrb.review.survey import write_survey
from acrb.stages import report, review, review_set
from acrb.stages.context import StageContext
from acrb.storage import read_csv
from tests.conftest import one_model_project, update_params
from tests.test_survey import record

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
    for arm in ("edited", "both"):
        assert f"review.agreement.{arm}.edit_success.alpha_ordinal" in metrics
        assert f"review.agreement.{arm}.edit_success.alpha_interval" in metrics
    assert f"review.{MODEL}.soft_erasure.delta_race.ppi" in metrics
    headline = project / layout.REVIEW_METRICS_DIR
    soft = json.loads((headline / MODEL / "soft_erasure.json").read_text(),
                      parse_constant=_no_constant)
    assert soft["race"] == round(metrics[f"review.{MODEL}.soft_erasure.delta_race.ppi"], 4)
    edit = json.loads((headline / "agreement" / "edit_success.json").read_text(),
                      parse_constant=_no_constant)
    assert edit["alpha_interval"] == round(
        metrics["review.agreement.both.edit_success.alpha_interval"], 4)
    assert edit["alpha_ordinal"] == round(
        metrics["review.agreement.both.edit_success.alpha_ordinal"], 4)
    info = json.loads((folder / "review.json").read_text())
    assert info["raters_per_item"] == "3" and info["simulated"] is True
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


def test_imported_survey_is_matched_to_requests_and_reported_as_it_is(project: Path) -> None:
    """A survey of the study's shape whose items are this run's outputs (named the survey's
    way: model `biased`, the source's cell) is matched to the requests, compared with the
    judges, and reported as people's ratings with the counts it has."""
    ctx = StageContext.load(project / "params.yaml", project)
    review_set.run(ctx)
    requests = read_table(project / layout.PLAN_TABLE, RequestRecord)
    plain = requests[(requests["arm"] == "none") & (requests["mode"] == "i2i")]
    cells = ["prompt_id", "race", "gender", "age"]
    unique = plain[~plain.duplicated(cells, keep=False)].head(12)
    assert len(unique) == 12
    records = []
    for i, (_, request) in enumerate(unique.iterrows()):
        for k in range(3 + i % 2):  # 3 or 4 raters per item
            records.append(record(
                f"user{k}", f"amt_{i:04d}", preserved=False, model="biased",
                promptId=request["prompt_id"], category=request["category"],
                originalItemId=f"{request['race']}_{request['gender']}_{request['age']}",
                race=request["race"], gender=request["gender"], age=request["age"],
                createdAt="__Timestamp__2026-01-19T17:59:54.489Z", taskId=1,
                edited_edit_success=1 + (i + k // 3) % 5))
    records.append(record("user0", "amt_9999", preserved=False, model="dalle"))
    records.append(record("user1", "amt_9999", preserved=False, model="dalle"))
    path = project / "survey.json"
    path.write_text(json.dumps(records))
    write_survey(path, project / layout.REVIEW_INPUTS)
    ctx = update_params(project, lambda p: p["review"].update(
        {"ratings": "inputs", "consensus": "mean"}))
    result = review.run(ctx)
    folder = project / layout.REVIEW_ANALYSIS_DIR
    matches = read_csv(folder / review.MATCHES_FILE, keep_default_na=False)
    assert len(matches) == 13
    matched = matches[matches["status"] == "matched"]
    assert len(matched) == 12 and set(matched["model"]) == {MODEL}
    assert set(matched["request_id"]) == set(unique["request_id"])
    lost = matches[matches["status"] != "matched"].iloc[0]
    assert lost["item_id"] == "amt_9999" and "'dalle'" in lost["note"]
    judge_human = pd.read_parquet(folder / "judge_human.parquet")
    overall = judge_human[(judge_human["dimension"] == "all")
                          & (judge_human["axis"] == "edit_success")].iloc[0]
    assert overall["n"] >= 10  # the matched items met their verdicts
    info = json.loads((folder / "review.json").read_text())
    assert info["raters_per_item"] == "2-4" and info["items"] == 13 == result.items
    assert info["simulated"] is False and info["matched_items"] == 12
    assert info["ratings_from"] == "people, imported from a survey export"
    report.run(ctx)
    html = (project / layout.REPORT_FILE).read_text()
    assert "simulated raters with planted noise" not in html
    assert "imported from a survey export" in html and "2-4 raters per item" in html
    assert "12 were matched" in html and "amt_9999" in html
    assert "drawn at random" not in html.split('id="review"')[1]


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


def test_the_surveys_age_direction_is_compared_with_the_judges(project: Path) -> None:
    """Table 7's age row under the study's scales: people's bipolar age answers (imported as
    ``age_direction``) against judges that scored ``age_direction`` (the study rubric), in the
    review's judge_human table and in the tables stage's per-model means."""
    from acrb.stages import tables

    ctx = StageContext.load(project / "params.yaml", project)
    review_set.run(ctx)
    requests = read_table(project / layout.PLAN_TABLE, RequestRecord)
    plain = requests[(requests["arm"] == "none") & (requests["mode"] == "i2i")]
    cells = ["prompt_id", "race", "gender", "age"]
    unique = plain[~plain.duplicated(cells, keep=False)].head(12)
    records = []
    for i, (_, request) in enumerate(unique.iterrows()):
        for k in range(3):
            records.append(record(
                f"user{k}", f"amt_{i:04d}", preserved=False, model="biased",
                promptId=request["prompt_id"], category=request["category"],
                originalItemId=f"{request['race']}_{request['gender']}_{request['age']}",
                race=request["race"], gender=request["gender"], age=request["age"],
                edited_age_drift=(2, 3, 5)[k] if i % 2 else 3))
    (project / "survey.json").write_text(json.dumps(records))
    write_survey(project / "survey.json", project / layout.REVIEW_INPUTS)
    # The judges' verdicts as the study rubric gives them: age_direction 4 on every output.
    verdicts_path = project / layout.verdicts_table(MODEL)
    verdicts = read_table(verdicts_path, VerdictRecord)
    verdicts["age_direction"] = 4.0
    write_table(verdicts_path, verdicts, VerdictRecord)
    ctx = update_params(project, lambda p: p["review"].update(
        {"ratings": "inputs", "consensus": "mean"}))
    review.run(ctx)
    folder = project / layout.REVIEW_ANALYSIS_DIR
    judge_human = pd.read_parquet(folder / "judge_human.parquet")
    row = judge_human[(judge_human["dimension"] == "all")
                      & (judge_human["axis"] == "age_direction")].iloc[0]
    # People's consensus: the mean of (2, 3, 5) rounded is 3 and 3 elsewhere: judge 4 - 3.
    assert row["n"] == 12 and row["mean_difference"] == pytest.approx(1.0)
    agreement_rows = pd.read_parquet(folder / "agreement.parquet")
    assert "age_direction" in set(agreement_rows["axis"])
    # The drift kept beside it is ACRB's age_change (2 and 4 are one step from 3: drift 3).
    assert "age_change" in set(judge_human["axis"])
    means, rule, note, _ = tables.judge_human_means(ctx, judge_human)
    assert note == "" and rule == "mean"
    age = means[(means["model"] == MODEL) & (means["axis"] == "age_direction")].iloc[0]
    assert age["n"] == 12 and age["judge_mean"] == 4.0 and age["human_mean"] == 3.0
