"""The paper's tables (`acrb tables`) on a tiny judged and reviewed project: every table as CSV
and LaTeX, numbers checked against plain pandas on the verdicts, the gap against its row, the
provenance, the tables read from the arms and WinoBias CSVs (and skipped without them), and
the report's sections."""

from __future__ import annotations

import json
import math
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


def _small_frame(scores: dict[str, list[float | None]], races: list[str],
                 status: list[str] | None = None, arm: str | None = None) -> pd.DataFrame:
    """An analysis frame of one request per row: source i (race ``races[i]``) under prompt
    P<i % 2> (both category B), with the given ensemble scores (None: no score)."""
    n = len(races)
    frame = pd.DataFrame({
        "request_id": [f"r{i}{arm or ''}" for i in range(n)],
        "source_id": [f"s{i}" for i in range(n)],
        "prompt_id": [f"P{i % 2}" for i in range(n)], "category": "B",
        "status": status or ["ok"] * n, "race": races, "gender": "Female", "age": "20s",
        "seed": 0, "experiment": "audit"})
    for axis, values in scores.items():
        frame[axis] = pd.array(values, dtype="Float64").astype(float)
    if arm is not None:
        frame["arm"] = arm
    return frame


SETTINGS = paper_tables.Resampling(n_boot=50, n_perm=50)


def test_edit_success_is_the_share_at_4_or_more_beside_the_mean() -> None:
    # 8 answered requests with a score, one refused without a score: 5 of 8 are >= 4.
    scores = [5, 4, 4, 3, 1, 2, 5, 4, None]
    frame = _small_frame({"edit_success": scores}, ["Black", "White"] * 4 + ["Black"],
                         status=["ok"] * 8 + ["refused"])
    frame["soft_erasure"] = pd.array([s is not None and s <= 2 for s in scores[:8]] + [None],
                                     dtype="boolean")
    table = paper_tables.model_summary({MODEL: frame}, SETTINGS).iloc[0]
    assert table["edit_success_ge4"] == pytest.approx(5 / 8)
    assert table["edit_success_ge4_n"] == 8
    assert table["edit_success"] == pytest.approx(28 / 8)
    assert table["edit_success_ge4_low"] <= 5 / 8 <= table["edit_success_ge4_high"]
    assert table["soft_erasure"] == pytest.approx(2 / 8)
    assert "edit_success >= 4" in table["definition"]
    # The interval is the clustered Wilson one of a rate (as every rate of the tables).
    block = paper_tables.pooled_block(paper_tables.with_score_outcomes(frame),
                                      "edit_success_ge4")
    from acrb.analysis.estimation.resampling import rate_intervals
    low, high = rate_intervals(block, 0.95)
    assert (table["edit_success_ge4_low"], table["edit_success_ge4_high"]) == pytest.approx(
        (low[0], high[0]))


def test_race_change_at_both_thresholds_per_race() -> None:
    # Black: 1, 3, 4, 5 -> >= 3: 3/4, >= 4: 2/4; White: 2, 3, 1, None -> 1/3 and 0/3.
    frame = _small_frame({"race_change": [1, 2, 3, 3, 4, 1, 5, None]},
                         ["Black", "White"] * 4)
    table = paper_tables.race_rates({MODEL: frame}, SETTINGS,
                                    outcomes=paper_tables.RACE_CHANGE_OUTCOMES)
    rate = table.set_index(["outcome", "race"])["rate"]
    assert rate["race_change_ge3", "Black"] == pytest.approx(3 / 4)
    assert rate["race_change_ge4", "Black"] == pytest.approx(2 / 4)
    assert rate["race_change_ge3", "White"] == pytest.approx(1 / 3)
    assert rate["race_change_ge4", "White"] == pytest.approx(0.0)
    assert table.set_index(["outcome", "race"])["n"]["race_change_ge3", "White"] == 3
    definitions = dict(zip(table["outcome"], table["definition"], strict=False))
    assert "race_change >= 3" in definitions["race_change_ge3"]
    assert "race_change >= 4" in definitions["race_change_ge4"]
    gap = paper_tables.race_gap({MODEL: frame}, SETTINGS).set_index("outcome")
    assert gap.loc["race_change_ge3", "gap"] == pytest.approx(3 / 4 - 1 / 3)
    assert gap.loc["race_change_ge4", "gap"] == pytest.approx(2 / 4)
    assert "race_change >= 4" in gap.loc["race_change_ge4", "definition"]
    assert "race_change >= 3" in gap.loc["race_change_ge3", "definition"]


def test_acrb_race_drift_stays_beside_only_where_it_differs() -> None:
    from acrb.config import OutcomeRule
    at_3 = {"race_drift": OutcomeRule(axis="race_change", at_least=3)}
    at_2 = {"race_drift": OutcomeRule(axis="race_change", at_least=2)}
    assert paper_tables.race_change_outcomes(at_3) == ("race_change_ge3", "race_change_ge4")
    assert paper_tables.race_change_outcomes(at_2) == ("race_change_ge3", "race_change_ge4",
                                                       "race_drift")
    assert "race_change >= 2" in paper_tables.definition("race_drift", at_2)
    assert "params judge.outcomes.race_drift" in paper_tables.definition("race_drift", at_2)


def test_feature_scores_are_mean_score_changes_per_race() -> None:
    none = _small_frame({"race_change": [3, 1, 4, 1], "skin_tone": [4, 3, 5, 3]},
                        ["Black", "White", "Black", "White"], arm="none")
    feature = _small_frame({"race_change": [1, 1, 2, 2], "skin_tone": [3, 3, 3, None]},
                           ["Black", "White", "Black", "White"], arm="feature")
    table = paper_tables.feature_scores({MODEL: pd.concat([none, feature])}, SETTINGS)
    change = table.set_index(["axis", "race"])
    # Race change: Black (3 -> 1, 4 -> 2): -2; White (1 -> 1, 1 -> 2): +0.5; all: -0.75.
    assert change.loc[("race_change", "Black"), "change"] == pytest.approx(-2.0)
    assert change.loc[("race_change", "White"), "change"] == pytest.approx(0.5)
    assert change.loc[("race_change", "all"), "change"] == pytest.approx(-0.75)
    assert change.loc[("race_change", "Black"), "mean_none"] == pytest.approx(3.5)
    assert change.loc[("race_change", "Black"), "mean_feature"] == pytest.approx(1.5)
    # Skin tone: White's second pair has no feature score, so it is one pair (3 -> 3).
    assert change.loc[("skin_tone", "White"), "n_pairs"] == 1
    assert change.loc[("skin_tone", "White"), "change"] == pytest.approx(0.0)
    assert change.loc[("skin_tone", "Black"), "change"] == pytest.approx(-1.5)
    assert change.loc[("race_change", "all"), "low"] <= -0.75 <= change.loc[
        ("race_change", "all"), "high"]
    assert set(table["axis"]) == {"race_change", "skin_tone"}


def test_white_vs_nonwhite_is_scipys_mann_whitney_with_holm() -> None:
    from scipy.stats import mannwhitneyu
    from statsmodels.stats.multitest import multipletests
    races = ["White", "Black", "Indian", "White", "Latino", "White", "Black", "EastAsian"]
    skin = [3, 5, 4, 3, 5, 4, 5, 4]
    race = [1, 2, 3, 1, 2, 1, 4, None]
    frames = {MODEL: _small_frame({"skin_tone": skin, "race_change": race}, races),
              "other": _small_frame({"skin_tone": skin[::-1], "race_change": race[::-1]},
                                    races)}
    table = paper_tables.white_vs_nonwhite(frames)
    assert list(table.columns) == list(paper_tables.MANN_WHITNEY_COLUMNS)
    for row in table.itertuples():
        frame = frames[row.model]
        values = frame[row.axis]
        white = values[(frame["race"] == "White") & values.notna()]
        other = values[(frame["race"] != "White") & values.notna()]
        expected = mannwhitneyu(white, other, alternative="two-sided")
        assert (row.n_white, row.n_other) == (len(white), len(other))
        assert row.u == pytest.approx(expected.statistic)
        assert row.p_value == pytest.approx(expected.pvalue)
        assert row.mean_white == pytest.approx(white.mean())
    holm = multipletests(table["p_value"], method="holm")[1]
    assert table["p_holm"].to_numpy() == pytest.approx(holm)
    assert len(table) == 4 and table["p_holm"].gt(table["p_value"]).any()
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(table)
    assert "independent" in shown.caption and "clustered" in shown.caption


def _units() -> pd.DataFrame:
    """Reviewed units of two models with judge and human (consensus) scores."""
    return pd.DataFrame({
        "model": ["a", "a", "a", "b", "b"],
        "judge_edit_success": [5, 4, None, 3, 2], "human_edit_success": [4, 2, 3, 3, 1],
        "judge_race_change": [1, 2, 1, 1, 3], "human_race_change": [1, 1, 1, None, 2]})


def test_judge_human_means_per_model_and_their_check_against_the_review() -> None:
    from acrb.analysis.agreement.raters import judge_human_agreement
    units = _units()
    means = paper_tables.judge_human_means(units, ["edit_success", "race_change"])
    got = means.set_index(["model", "axis"])
    # Model a, edit success: the unit without a judge score is left out of both means.
    assert got.loc[("a", "edit_success"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([2, 4.5, 3.0])
    assert got.loc[("b", "race_change"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([1, 3.0, 2.0])
    assert got.loc[("all", "edit_success"), ["n", "judge_mean", "human_mean"]].tolist() == \
        pytest.approx([4, 3.5, 2.5])
    # The review stage's own table on the same units is reproduced; a shifted one is not.
    review_units = units.assign(output="edited", race="Black", gender="Female", age="20s")
    review = judge_human_agreement(review_units, axes=["edit_success", "race_change"])
    assert paper_tables.means_reproduce(review, means)
    shifted = review.assign(mean_difference=review["mean_difference"] + 0.5)
    assert not paper_tables.means_reproduce(shifted, means)
    table = paper_tables.judge_human(review, None, means, "mean")
    assert list(table.columns) == list(paper_tables.JUDGE_HUMAN_COLUMNS)
    assert list(table["model"]) == ["a", "a", "b", "b", "all", "all"]
    row = table.set_index(["model", "axis"]).loc[("a", "edit_success")]
    assert (row["judge_mean"], row["human_mean"]) == pytest.approx((4.5, 3.0))
    assert row["mean_difference"] == pytest.approx(1.5) and row["consensus"] == "mean"
    shown = paper_tables.SPECS["judge_human"].display(table)
    assert "the mean of an output's ratings" in shown.caption


def test_table_1_shows_the_age_axis_the_judges_produced_under_its_own_name() -> None:
    acrb = _small_frame({"edit_success": [4, 5], "age_change": [1, 2],
                         "age_direction": [None, None]}, ["Black", "White"])
    study = _small_frame({"edit_success": [4, 5], "age_direction": [3, 4],
                          "age_change": [None, None]}, ["Black", "White"])
    header = paper_tables.SPECS["judge_means"].display(
        paper_tables.judge_means({MODEL: acrb}, SETTINGS)).header
    assert header[-1] == "ACRB age change (1 same-5 complete)"
    assert "Age change" not in header
    table = paper_tables.judge_means({MODEL: study}, SETTINGS)
    header = paper_tables.SPECS["judge_means"].display(table).header
    assert header[-1] == "Age change" and "ACRB age change (1 same-5 complete)" not in header
    age = table.set_index("axis").loc["age_direction"]
    assert age["mean"] == pytest.approx(3.5) and "much younger" in age["definition"]


def test_winobias_renders_the_single_rate_when_the_analysis_wrote_it() -> None:
    rows = [{"model": MODEL, "role_coding": c, "n": 10, "following": k, "rate": k / 10,
             "low": 0.1, "high": 0.9, "p_value": 0.5, "abstained": 0, "confidence": 0.95}
            for c, k in (("male", 8), ("female", 6))]
    without = paper_tables.winobias(pd.DataFrame(rows), None)
    assert list(without["role_coding"]) == ["male", "female"]
    shown = paper_tables.SPECS["winobias"].display(without)
    assert [r[1] for r in shown.rows] == ["male", "female"]
    paper = {**rows[0], "role_coding": paper_tables.WINOBIAS_PAPER_ROW, "n": 20,
             "following": 14, "rate": 0.7, "definition": "both codings pooled"}
    table = paper_tables.winobias(pd.DataFrame([*rows, paper]), None)
    assert list(table["role_coding"]) == ["stereotype", "male", "female"]
    shown = paper_tables.SPECS["winobias"].display(table)
    assert shown.rows[0][1:5] == ["both (paper)", "14/20", "70.0 [10.0, 90.0]", "30.0"]
    assert "both codings pooled" in shown.caption


# Header pinning: each header sits over its own column.


def _cell_under(shown: paper_tables.Display, header: str, row: int = 0) -> str:
    return shown.rows[row][shown.header.index(header)]


def test_table_3_headers_sit_over_their_columns() -> None:
    frame = pd.DataFrame([{
        "model": MODEL, "confidence": 0.95, "definition": "",
        **{f"{m}{suffix}": value for m, value in (
            ("edit_success_ge4", 0.61), ("edit_success", 4.22), ("soft_erasure", 0.13),
            ("race_change_ge3", 0.27), ("race_change_ge4", 0.09), ("race_drift", 0.44))
           for suffix, value in (("", value), ("_low", math.nan), ("_high", math.nan),
                                 ("_n", 10))}}])
    shown = paper_tables.SPECS["model_summary"].display(frame)
    assert _cell_under(shown, "Edit success >= 4 (%)") == "61.0"
    assert _cell_under(shown, "Edit success (mean, 1-5)") == "4.22"
    assert _cell_under(shown, "Soft erasure (%)") == "13.0"
    assert _cell_under(shown, "Race change >= 3 (%)") == "27.0"
    assert _cell_under(shown, "Race change >= 4 (%)") == "9.0"
    assert _cell_under(shown, "Race drift, ACRB (%)") == "44.0"


def test_tables_1_2_4_8_9_and_7_headers_sit_over_their_columns() -> None:
    frame = _small_frame({"edit_success": [5, 4, 4, 1], "skin_tone": [3, 4, 5, 5],
                          "race_change": [1, 3, 4, 1], "gender_change": [1, 1, 2, 2],
                          "age_change": [2, 2, 2, 2]}, ["Black", "White"] * 2)
    frame["judge_lightening"] = pd.array([False, True, True, True], dtype="boolean")
    means = paper_tables.judge_means({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["judge_means"].display(means)
    for axis, expected in (("Edit success", "3.50"), ("Skin tone", "4.25"),
                           ("Race change", "2.25"), ("Gender change", "1.50")):
        assert _cell_under(shown, axis).startswith(expected), axis
    rates = paper_tables.race_rates({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["race_rates"].display(rates)
    black = [r[0] for r in shown.rows].index("Black")
    assert _cell_under(shown, f"{MODEL}: Judged skin lightening (%)", black).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 3 (%)", black).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 4 (%)", black).startswith("50.0")
    white = [r[0] for r in shown.rows].index("White")
    assert _cell_under(shown, f"{MODEL}: Judged skin lightening (%)", white).startswith("100.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 3 (%)", white).startswith("50.0")
    assert _cell_under(shown, f"{MODEL}: Race change >= 4 (%)", white).startswith("0.0")
    gap = paper_tables.race_gap({MODEL: frame}, SETTINGS)
    shown = paper_tables.SPECS["race_gap"].display(gap)
    assert [_cell_under(shown, "Outcome", i) for i in range(2)] == ["Race change >= 3",
                                                                    "Race change >= 4"]
    assert _cell_under(shown, "White", 1) == "0.0" and _cell_under(shown, "Black", 1) == "50.0"
    assert _cell_under(shown, "Gap (pp)", 1).startswith("50.0")
    mw = paper_tables.white_vs_nonwhite({MODEL: frame})
    shown = paper_tables.SPECS["white_vs_nonwhite"].display(mw)
    skin = [r[1] for r in shown.rows].index("Skin tone")
    assert _cell_under(shown, "Mean White", skin) == "4.50"
    assert _cell_under(shown, "Mean other", skin) == "4.00"
    assert _cell_under(shown, "n White", skin) == "2"
    assert _cell_under(shown, "U", skin) == fmt_u(mw, "skin_tone")
    table = pd.DataFrame([{"model": MODEL, "axis": "race_change", "race": "Black",
                           "change": -1.25, "low": math.nan, "high": math.nan},
                          {"model": MODEL, "axis": "skin_tone", "race": "Black",
                           "change": 0.5, "low": math.nan, "high": math.nan}])
    shown = paper_tables.SPECS["feature_scores"].display(table)
    assert _cell_under(shown, "Race change change") == "-1.25"
    assert _cell_under(shown, "Skin tone change") == "0.50"
    human = pd.DataFrame([{c: math.nan for c in paper_tables.JUDGE_HUMAN_COLUMNS}])
    human = human.assign(model=MODEL, axis="skin_tone", n=9, judge_mean=3.71, human_mean=3.22,
                         mean_difference=0.49, weighted_kappa=0.11, spearman=0.33,
                         human_alpha=0.44, human_alpha_interval=0.52, consensus="mean")
    shown = paper_tables.SPECS["judge_human"].display(human)
    assert [_cell_under(shown, h) for h in (
        "Judges' mean", "People's mean", "Judge - human", "Weighted kappa", "Spearman",
        "Human alpha (interval)", "Human alpha (ordinal)")] == \
        ["3.71", "3.22", "0.49", "0.11", "0.33", "0.52", "0.44"]


def fmt_u(table: pd.DataFrame, axis: str) -> str:
    return f"{float(table.set_index('axis').loc[axis, 'u']):.1f}"
