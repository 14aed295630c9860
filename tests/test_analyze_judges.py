"""The analyze and report stages with and without the judges' tables, in process, on the tiny
project: without judges nothing about judges appears; with a verdicts table and two judges'
score tables, the judge outcomes go through the rates and Δ tables and the judge tables,
metrics and report section appear. The score tables are written here through the record schema,
as the judge stage writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.analysis.agreement.judging import JUDGING_FILES, read_judging
from acrb.analysis.outcomes import JUDGE_OUTCOMES
from acrb.analysis.outputs.headline import read_detailed_metrics
from acrb.records import (
    SCORE_AXES,
    JudgementRecord,
    ScoreRecord,
    VerdictRecord,
    read_table,
    write_table,
)
from acrb.stages import analyze, evaluate, generate, plan, prompts, report, sources
from acrb.stages.context import StageContext

MODEL = "synthetic-biased"


def _set_params(root: Path, judges: bool) -> StageContext:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {MODEL: params["models"][MODEL]}
    # Few resamples: this checks the wiring, the statistics have their own tests.
    params["analyze"].update({"bootstrap": 200, "permutations": 200})
    params["judges"] = {"g": {"kind": "simulated"}, "o": {"kind": "simulated"}}
    params.setdefault("judge", {})["use"] = ["g", "o"] if judges else []
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return StageContext.load(root / "params.yaml", root)


def _write_judge_tables(root: Path) -> pd.DataFrame:
    """Two judges' scores of the model's edits and their verdicts: judge g abstains on every
    Black face, edit success is 1 on erased edits, 5 otherwise (judge o one lower on every
    fourth), so soft erasure follows the detectors' erasure."""
    judgements = read_table(root / layout.judgements_table(MODEL), JudgementRecord)
    plan_table = pd.read_parquet(root / layout.PLAN_TABLE)
    sources_table = pd.read_parquet(root / layout.SOURCES_TABLE)
    race = judgements.merge(plan_table[["request_id", "source_id"]], on="request_id").merge(
        sources_table[["source_id", "race"]], on="source_id").set_index("request_id")["race"]
    rows: dict[str, list[dict]] = {"g": [], "o": []}
    verdicts = []
    for i, item in enumerate(judgements.itertuples(index=False)):
        judged = item.status == "ok" and not item.hard_refusal
        edit = 1 if judged and item.erasure else 5
        scores = {"g": edit, "o": max(edit - (i % 4 == 0), 1)}
        for judge, score in scores.items():
            abstains = judge == "g" and race[item.request_id] == "Black"
            status = ("not_judged" if not judged else "abstained" if abstains else "scored")
            row = {"request_id": item.request_id, "model": MODEL, "judge": judge,
                   "judge_id": judge, "image_sha256": None, "status": status}
            if status == "scored":
                row.update({"edit_success": score, "skin_tone": 3 + (i % 3 == 0),
                            "race_change": 1, "gender_change": 1, "age_change": 1 + i % 2,
                            "cue_retention": float(edit >= 3)})
            rows[judge].append(row)
        verdict = {"request_id": item.request_id, "model": MODEL, "judges": "g,o",
                   "rule": "study", "status": "scored" if judged else "not_judged"}
        if judged:
            verdict.update({"edit_success": float(edit), "skin_tone": 3.0 + (i % 3 == 0),
                            "race_change": 1.0, "gender_change": 1.0, "age_change": 1.0,
                            "cue_retention": float(edit >= 3),
                            "needs_review": i % 5 == 0,
                            "soft_erasure": edit <= 2, "judge_lightening": i % 3 == 0,
                            "judge_darkening": False, "race_drift": False,
                            "gender_drift": False, "age_drift": False,
                            "cue_erasure": edit < 3})
        verdicts.append(verdict)
    for judge, judge_rows in rows.items():
        write_table(root / layout.scores_table(MODEL, judge), judge_rows, ScoreRecord)
    write_table(root / layout.verdicts_table(MODEL), verdicts, VerdictRecord)
    return judgements


# About 50 s on 2 cores (four analyze runs, figures included): over the budget of a default test.
@pytest.mark.slow
def test_analyze_and_report_with_and_without_judges(project: Path) -> None:
    ctx = _set_params(project, judges=False)
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)
    generate.run(ctx, MODEL)
    evaluate.run(ctx, MODEL)
    folder = project / layout.ANALYSIS_DIR / MODEL

    # Without judges: no judge column, table, metric or report section.
    (result,) = analyze.run(ctx)
    assert result.judging is None
    assert not set(JUDGE_OUTCOMES) & set(result.frame.columns)
    assert not set(JUDGE_OUTCOMES) & set(result.rates["outcome"])
    metrics = read_detailed_metrics(project / layout.detailed_metrics(MODEL))
    assert not [k for k in metrics if k.split(".")[0] in ("judge", "agreement", "abstention")]
    assert "delta_soft_erasure" not in metrics
    assert read_judging(folder) is None
    html = report.run(ctx).read_text()
    assert "Judges" not in html

    # Verdicts for a model without judges configured are not read.
    judgements = _write_judge_tables(project)
    (result,) = analyze.run(ctx)
    assert result.judging is None

    # With judges.
    ctx = _set_params(project, judges=True)
    (result,) = analyze.run(ctx)
    frame = result.frame
    judged = frame["verdict_status"] == "scored"
    assert judged.sum() == ((judgements["status"] == "ok") & ~judgements["hard_refusal"]
                            .astype(bool)).sum()
    # Soft erasure here is the detectors' erasure, read back through the verdicts.
    assert (frame.loc[judged, "soft_erasure"].astype(bool)
            == frame.loc[judged, "erasure"].astype(bool)).all()
    assert frame.loc[~judged, "soft_erasure"].isna().all()
    assert {"soft_erasure", "cue_erasure"} <= set(result.rates["outcome"])
    assert "soft_erasure" in set(result.disparities["outcome"])
    assert result.planted is not None  # only the detectors' outcomes have planted values
    assert set(result.planted["outcome"]) == {"hard_refusal", "erasure", "lightening"}

    tables = read_judging(folder)
    assert tables is not None and tables.judges == ("g", "o")
    assert all((folder / name).exists() for name in JUDGING_FILES.values())
    means = tables.means.set_index("axis")
    erased = frame.loc[judged, "erasure"].astype(bool)
    assert means.loc["edit_success", "n"] == judged.sum()
    assert np.isclose(means.loc["edit_success", "mean"], (1 * erased + 5 * ~erased).mean())
    assert list(means.index) == list(SCORE_AXES)
    g_race = tables.abstention[(tables.abstention["judge"] == "g")
                               & (tables.abstention["event"] == "abstention")
                               & (tables.abstention["dimension"] == "race")].set_index("group")
    assert g_race.loc["Black", "rate"] == 1.0 and g_race.loc["White", "rate"] == 0.0
    # Judge g never scored a Black face: no pair there.
    black = tables.agreement[(tables.agreement["group"] == "Black")
                             & (tables.agreement["axis"] == "edit_success")]
    assert black["n_pairs"].iloc[0] == 0
    assert len(tables.tests) and set(tables.tests["dimension"]) == {"race", "gender", "age"}

    metrics = read_detailed_metrics(project / layout.detailed_metrics(MODEL))
    assert metrics["judge.edit_success.mean"] == round(means.loc["edit_success", "mean"], 6)
    for key in ("agreement.edit_success.kappa", "agreement.edit_success.alpha",
                "abstention.g.rate", "abstention.g.race.p_adjusted", "error.o.rate",
                "needs_review.rate", "delta_soft_erasure", "soft_erasure_rate.race.Black",
                "score_test.edit_success.race.kruskal.p_adjusted"):
        assert key in metrics, key
    assert metrics["abstention.o.rate"] == 0.0
    rates_csv = pd.read_csv(project / layout.PLOTS_DIR / "rates.csv")
    assert "soft_erasure" in set(rates_csv["outcome"])

    html = report.run(ctx).read_text()
    assert "Judges" in html and "Mean judge score" in html
    assert "Krippendorff" in html and "abstention" in html.lower()
    latex = project / "reports" / "tables" / "judge-means.tex"
    assert latex.exists() and "\\toprule" in latex.read_text()

    # Judges removed again: the judge tables of the earlier run go with them.
    ctx = _set_params(project, judges=False)
    analyze.run(ctx)
    assert read_judging(folder) is None
    assert "Judges" not in report.run(ctx).read_text()
