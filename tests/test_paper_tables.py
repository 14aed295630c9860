"""The paper's tables (`acrb tables`) on a tiny judged and reviewed project: every table as CSV
and LaTeX, numbers checked against plain pandas on the verdicts, the gap against its row, the
provenance, the tables read from the arms and WinoBias CSVs (and skipped without them), and
the report's sections."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from acrb import layout
from acrb.analysis.estimation.resampling import clustered_rates
from acrb.analysis.inputs import analysis_frame
from acrb.analysis.outputs import paper_tables
from acrb.cli import app
from acrb.stages import (
    analyze,
    evaluate,
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
from tests.conftest import update_params, write_params

MODEL = "synthetic-biased"
#: 4 sources (2 races x 2 genders) x 20 prompts (two categories), a small review and short
#: resampling keep the project small.
CHANGES = {"sources": {"ages": ["20s"]}, "prompts": {"categories": ["A", "B"]},
           "analyze": {"bootstrap": 200, "permutations": 200},
           "review": {"sample_size": 30}}


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One editor generated, evaluated, judged, analysed and reviewed once per module."""
    root = tmp_path_factory.mktemp("tables") / "project"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, CHANGES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        patch.chdir(root)
        ctx = update_params(root, lambda p: p.update(models={MODEL: p["models"][MODEL]}))
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        generate.run(ctx, MODEL)
        evaluate.run(ctx, MODEL)
        judge.run(ctx, MODEL)
        analyze.run(ctx)
        review_set.run(ctx)
        review.run(ctx)
    return root


@pytest.fixture
def project(reviewed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    shutil.copytree(reviewed, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    return root


def _answered(project: Path) -> pd.DataFrame:
    """Plain pandas: the plain-arm audit requests the model answered, with their verdicts."""
    requests = pd.read_parquet(project / layout.PLAN_TABLE)
    requests = requests[(requests["model"] == MODEL) & (requests["arm"] == "none")
                        & (requests["experiment"] == "audit")]
    status = pd.read_parquet(project / layout.judgements_table(MODEL))[["request_id", "status"]]
    verdicts = pd.read_parquet(project / layout.verdicts_table(MODEL))
    rows = requests[["request_id", "source_id", "race"]].merge(status, on="request_id")
    rows = rows[rows["status"].isin(["ok", "refused"])]
    return rows.merge(verdicts.drop(columns=["model", "status"]), on="request_id", how="left")


def _arms_csvs(folder: Path) -> None:
    """group_rates.csv and gap.csv in the schema the feature-arm analysis writes."""
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([
        {"model": MODEL, "outcome": "race_drift", "dimension": "race", "group": g,
         "n_pairs": 40, "rate_none": none, "rate_feature": feat, "change": feat - none,
         "low": feat - none - 0.05, "high": feat - none + 0.05, "confidence": 0.95}
        for g, none, feat in (("Black", 0.30, 0.10), ("White", 0.05, 0.04))
    ] + [{"model": MODEL, "outcome": "race_drift", "dimension": "gender", "group": "Male",
          "n_pairs": 40, "rate_none": 0.2, "rate_feature": 0.1, "change": -0.1, "low": -0.2,
          "high": 0.0, "confidence": 0.95}]).to_csv(folder / "group_rates.csv", index=False)
    pd.DataFrame([{"model": MODEL, "outcome": "race_drift", "dimension": "race",
                   "delta_none": 0.25, "delta_feature": 0.06, "narrowing": 0.19, "low": 0.1,
                   "high": 0.28, "p_value": 0.004, "confidence": 0.95}]).to_csv(
        folder / "gap.csv", index=False)


def _winobias_csvs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([
        {"model": MODEL, "role_coding": coding, "n": 50, "following": k, "rate": k / 50,
         "low": k / 50 - 0.1, "high": k / 50 + 0.1, "p_value": p, "abstained": 2,
         "confidence": 0.95}
        for coding, k, p in (("male", 38, 0.0003), ("female", 27, 0.67))
    ]).to_csv(folder / "rates.csv", index=False)
    pd.DataFrame([{"model": "single-image-editor", "reason": "takes one image"}]).to_csv(
        folder / "skipped.csv", index=False)


def test_every_table_written_with_its_numbers_and_provenance(project: Path) -> None:
    _arms_csvs(project / layout.ARMS_DIR)
    _winobias_csvs(project / layout.WINOBIAS_DIR)
    ctx = StageContext.load(project / "params.yaml", project)
    results = {r.id: r for r in tables.run(ctx)}
    folder = project / layout.TABLES_DIR
    # This project's plan has no feature arm: table 8 (computed from the arm's pairs) is
    # skipped, while table 5 reads the planted CSVs (the paper profile's run writes both).
    assert [r.id for r in results.values() if not r.written] == ["feature_scores"]
    assert "no feature arm" in results["feature_scores"].note
    for spec in [s for s in paper_tables.TABLES if s.id != "feature_scores"]:
        csv = pd.read_csv(folder / f"{spec.id}.csv")
        tex = (folder / f"{spec.id}.tex").read_text()
        assert len(csv) > 0, spec.id
        assert r"\toprule" in tex and r"\bottomrule" in tex and "SIMULATION" in tex, spec.id
        assert ctx.params_hash in tex, spec.id

    answered = _answered(project)
    # Table 1: the mean of each axis over answered requests with a score.
    means = pd.read_csv(folder / "judge_means.csv")
    assert list(means.columns) == list(paper_tables.JUDGE_MEANS_COLUMNS)
    assert list(means["axis"]) == list(paper_tables.MEAN_AXES)
    for row in means.itertuples():
        scores = answered[row.axis].dropna()
        assert row.n == len(scores) > 40
        assert row.mean == pytest.approx(scores.mean(), rel=1e-5)
        assert row.n_sources == answered.loc[scores.index, "source_id"].nunique() == 4
        assert row.low <= row.mean <= row.high
    # Table 3: edit success (the share >= 4, and the mean score), soft erasure and race
    # change rates at >= 3 and >= 4 (the params' race_drift is the >= 3 one, so not repeated).
    summary = pd.read_csv(folder / "model_summary.csv").iloc[0]
    assert summary["edit_success"] == pytest.approx(answered["edit_success"].mean(), rel=1e-5)
    edit = answered["edit_success"].dropna()
    assert summary["edit_success_ge4"] == pytest.approx((edit >= 4).mean(), rel=1e-5)
    assert summary["edit_success_ge4_n"] == len(edit)
    assert "race_drift" not in summary.index
    race_change = answered["race_change"].dropna()
    for outcome, seen in (("soft_erasure", answered["soft_erasure"].dropna().astype(bool)),
                          ("race_change_ge3", race_change >= 3),
                          ("race_change_ge4", race_change >= 4)):
        assert summary[f"{outcome}_n"] == len(seen)
        assert summary[outcome] == pytest.approx(seen.mean(), rel=1e-5, abs=1e-9)
        assert summary[f"{outcome}_low"] <= summary[outcome] <= summary[f"{outcome}_high"]
    drift = answered["race_drift"].dropna().astype(bool)
    assert summary["race_change_ge3"] == pytest.approx(drift.mean(), abs=1e-9)
    assert "edit_success >= 4" in summary["definition"]
    # The same quantity gets the same interval in tables 1 and 3.
    edit = means[means["axis"] == "edit_success"].iloc[0]
    assert (edit["low"], edit["high"]) == pytest.approx(
        (summary["edit_success_low"], summary["edit_success_high"]))
    # Table 2: per race the judged lightening rate; the simulated editor lightens Black
    # sources' skin more (planted), and the intervals are the report's clustered ones.
    rates = pd.read_csv(folder / "race_rates.csv")
    assert set(rates["outcome"]) == set(paper_tables.RACE_OUTCOMES)
    assert set(rates["race"]) == {"Black", "White"}
    lightening = rates[rates["outcome"] == "judge_lightening"].set_index("race")
    for race in ("Black", "White"):
        seen = answered.loc[answered["race"] == race, "judge_lightening"].dropna().astype(bool)
        assert lightening.loc[race, "rate"] == pytest.approx(seen.mean(), rel=1e-5)
        assert lightening.loc[race, "n"] == len(seen)
    assert lightening.loc["Black", "rate"] > lightening.loc["White", "rate"]
    # Table 4: races as columns, the gap is max - min of its row.
    gap = pd.read_csv(folder / "race_gap.csv")
    assert {"Black", "White", "gap", "low", "high", "p_value"} <= set(gap.columns)
    assert list(gap["outcome"]) == ["race_change_ge3", "race_change_ge4"]
    row = gap.iloc[0]
    assert row["gap"] == pytest.approx(max(row["Black"], row["White"])
                                       - min(row["Black"], row["White"]), abs=1e-9)
    assert row["low"] <= row["gap"] <= row["high"]
    # Table 5 and 6 come from the schema CSVs.
    feature = pd.read_csv(folder / "feature_mitigation.csv")
    assert list(feature["group"]) == ["Black", "White", paper_tables.GAP_ROW]  # race only
    gap_row = feature.iloc[-1]
    assert gap_row["change"] == pytest.approx(0.06 - 0.25)
    assert (gap_row["low"], gap_row["high"]) == pytest.approx((-0.28, -0.1))
    assert gap_row["narrowing"] == pytest.approx(0.19)
    wino = pd.read_csv(folder / "winobias.csv")
    assert list(wino["model"]) == [MODEL, MODEL, "single-image-editor"]
    assert wino["note"].iloc[-1] == "not run: takes one image"
    assert "76.0" in (folder / "winobias.tex").read_text()  # 38/50 as a percentage
    # Table 7: judge vs human per axis, from the review stage.
    human = pd.read_csv(folder / "judge_human.csv")
    judge_human = pd.read_parquet(project / layout.REVIEW_ANALYSIS_DIR / "judge_human.parquet")
    overall = judge_human[judge_human["dimension"] == "all"].set_index("axis")
    every = human[human["model"] == paper_tables.ALL_MODELS]
    assert list(every["axis"]) == list(overall.index)
    assert every.set_index("axis")["weighted_kappa"].to_numpy() == pytest.approx(
        overall["weighted_kappa"].to_numpy(), rel=1e-5, nan_ok=True)
    assert every["human_alpha"].notna().all() and every["human_alpha_interval"].notna().all()
    # People's agreement on the edited outputs: interval alpha (the paper's) beside ordinal.
    rater = pd.read_parquet(project / layout.REVIEW_ANALYSIS_DIR / "agreement.parquet")
    edited = rater[(rater["dimension"] == "all") & (rater["arm"] == "edited")]
    for statistic, column in (("alpha_interval", "human_alpha_interval"),
                              ("alpha_ordinal", "human_alpha")):
        expected = edited[edited["statistic"] == statistic].set_index("axis")["estimate"]
        assert every.set_index("axis")[column].to_numpy() == pytest.approx(
            expected.loc[every["axis"]].to_numpy(), rel=1e-5)
    # Per model the judges' and people's means, under the rule the review stage used (its
    # review.json names the default, the median) and reproducing its table.
    per_model = human[human["model"] == MODEL].set_index("axis")
    assert list(per_model.index) == list(overall.index)
    assert set(human["consensus"]) == {"median"}
    assert per_model["judge_mean"].notna().all() and per_model["human_mean"].notna().all()
    by_model = judge_human[judge_human["dimension"] == "model"].set_index("axis")
    assert (per_model["judge_mean"] - per_model["human_mean"]).to_numpy() == pytest.approx(
        by_model["mean_difference"].to_numpy(), abs=1e-5)
    assert "the median of an output's ratings" in (folder / "judge_human.tex").read_text()
    # Table 9: Mann-Whitney of White against the other sources.
    mw = pd.read_csv(folder / "white_vs_nonwhite.csv")
    assert set(mw["axis"]) >= {"edit_success", "skin_tone"} and mw["p_holm"].notna().any()
    white = answered[answered["race"] == "White"]["skin_tone"].dropna()
    assert mw.set_index("axis").loc["skin_tone", "n_white"] == len(white)

    index = json.loads((folder / "index.json").read_text())
    assert index["params_hash"] == ctx.params_hash and index["simulated"] is True
    assert [t["number"] for t in index["tables"]] == list(range(1, 10))
    first = index["tables"][0]
    assert first["files"] == {"csv": "data/tables/judge_means.csv",
                              "tex": "data/tables/judge_means.tex"}
    inputs = first["provenance"]["inputs"]
    assert set(inputs) == {str(layout.PLAN_TABLE), str(layout.judgements_table(MODEL)),
                           str(layout.verdicts_table(MODEL))}
    from acrb.storage import sha256_file
    assert inputs[str(layout.PLAN_TABLE)] == sha256_file(project / layout.PLAN_TABLE)
    assert first["provenance"]["inputs_sha256"][:12] in (folder / "judge_means.tex").read_text()
    assert set(index["tables"][4]["provenance"]["inputs"]) == {
        str(layout.ARMS_DIR / "group_rates.csv"), str(layout.ARMS_DIR / "gap.csv")}

    report.run(ctx)
    html = (project / layout.REPORT_FILE).read_text()
    assert 'id="paper-tables"' in html
    for spec in paper_tables.TABLES:
        assert f'id="paper-table-{spec.id}"' in html
    assert "Edit success &gt;= 4 (%)" in html and "People&#39;s mean" in html
    assert "not run: takes one image" in html and ctx.params_hash in html


def test_tables_5_and_6_are_skipped_with_a_note_when_absent(project: Path) -> None:
    folder = project / layout.TABLES_DIR
    folder.mkdir(parents=True)
    (folder / "winobias.csv").write_text("stale\n")  # a table of an earlier run goes
    result = CliRunner().invoke(app, ["tables"])
    assert result.exit_code == 0, result.output
    assert "tables feature_mitigation: skipped: the plan has no feature arm" in result.output
    assert "tables winobias: skipped" in result.output
    assert not (folder / "winobias.csv").exists()
    assert not (folder / "feature_mitigation.tex").exists()
    index = json.loads((folder / "index.json").read_text())
    status = {t["id"]: t["status"] for t in index["tables"]}
    assert status == {"judge_means": "written", "race_rates": "written",
                      "model_summary": "written", "race_gap": "written",
                      "feature_mitigation": "skipped", "winobias": "skipped",
                      "judge_human": "written", "feature_scores": "skipped",
                      "white_vs_nonwhite": "written"}
    ctx = StageContext.load(project / "params.yaml", project)
    report.run(ctx)
    html = (project / layout.REPORT_FILE).read_text()
    assert 'id="paper-table-winobias"' in html and "Not produced: the plan has no WinoBias" in html


def test_people_means_are_left_out_unless_the_review_names_its_rule(project: Path) -> None:
    from acrb.stages.tables import judge_human_means

    ctx = StageContext.load(project / "params.yaml", project)
    info_path = project / layout.REVIEW_ANALYSIS_DIR / "review.json"
    rows = pd.read_parquet(project / layout.REVIEW_ANALYSIS_DIR / "judge_human.parquet")
    means, rule, note, _ = judge_human_means(ctx, rows)
    assert means is not None and rule == "median" and note == ""
    info = json.loads(info_path.read_text())
    # Means that do not reproduce the review's own table are never shown under its rule.
    shifted = rows.assign(mean_difference=rows["mean_difference"] + 0.25)
    means, rule, note, _ = judge_human_means(ctx, shifted)
    assert means is None and rule == "median" and "do not reproduce" in note
    # A review.json from before the rule was recorded names none: no guess.
    info_path.write_text(json.dumps({k: v for k, v in info.items() if k != "consensus"}))
    means, rule, note, _ = judge_human_means(ctx, rows)
    assert means is None and rule == "" and "does not name the consensus rule" in note


def test_race_rate_intervals_are_the_reports_clustered_ones(project: Path) -> None:
    """Table 2's interval is the one the report's group rates show (``clustered_rates``:
    Wilson at the two-way clustered effective n), so the paper table and the report agree."""
    ctx = StageContext.load(project / "params.yaml", project)
    frame = analysis_frame(ctx, MODEL)
    settings = paper_tables.Resampling(confidence=0.9, n_boot=300, seed=7, resample="sources")
    table = paper_tables.race_rates({MODEL: frame}, settings, outcomes=("judge_lightening",))
    report = clustered_rates(frame, "judge_lightening", 0.9)
    report = report[(report["category"] == "all") & (report["dimension"] == "race")]
    report = report.set_index("value").loc[list(table["race"])]
    assert table["rate"].to_numpy() == pytest.approx(report["rate"].to_numpy())
    assert table["low"].to_numpy() == pytest.approx(report["ci_low"].to_numpy())
    assert table["high"].to_numpy() == pytest.approx(report["ci_high"].to_numpy())
    # Wider coverage, wider interval: the settings reach the interval.
    wide = paper_tables.race_rates({MODEL: frame}, paper_tables.Resampling(
        confidence=0.99, n_boot=300, seed=7, resample="sources"), outcomes=("judge_lightening",))
    assert ((wide["high"] - wide["low"]) > (table["high"] - table["low"])).all()


# --------------------------------------------------------------------------------------------
# The paper's definitions, each against a hand-computed answer on a small frame
