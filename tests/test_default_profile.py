"""The committed embedded default, run in full: the audit finds what was planted, and no more.

This is the acceptance check of the default profile (84 sources x 50 prompts x 2 simulated
editors = 8,400 requests, and 2,500 T2I prompts for the simulated generator). It runs the
stages in process, without DVC or MLflow, from the committed params.yaml; it takes about two
minutes on two cores.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from acrb import layout
from acrb.analysis.outcomes import DETECTOR_OUTCOMES, OUTCOME_NAMES
from acrb.stages import analyze
from acrb.stages.context import StageContext
from tests.conftest import CATALOG, REPO, RUBRIC, run_pipeline


@pytest.fixture(scope="module")
def default_project(tmp_path_factory: pytest.TempPathFactory
                    ) -> tuple[Path, dict[str, analyze.ModelAnalysis]]:
    root = tmp_path_factory.mktemp("default")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    # The proportional-odds fits are the slowest judge table and add nothing checked here.
    params["analyze"]["ordinal_model"] = False
    # Fewer bootstrap replicates for the raters' agreement intervals (checked elsewhere).
    params["review"]["bootstrap"] = 200
    # Everything up to the judges runs with the committed params, on the committed files (the
    # catalog, the sentences, the rubrics at the paths params.yaml names): their outputs are
    # compared with the committed dvc.lock below.
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.yaml").write_text("stages: {}\n")
    shutil.copytree(CATALOG.parent, root / "src" / "acrb" / "prompts" / "data")
    shutil.copytree(RUBRIC.parent, root / "src" / "acrb" / "judges" / "rubrics")
    ctx = StageContext.load(root / "params.yaml", root)
    assert ctx.params.profile.name == "embedded-default"
    results = run_pipeline(ctx)
    assert (root / layout.METRICS_DIR / "synthetic-biased" / "refusal.json").exists()
    return root, {result.model: result for result in results}


@pytest.fixture(scope="module")
def default_run(default_project: tuple[Path, dict[str, analyze.ModelAnalysis]]
                ) -> dict[str, analyze.ModelAnalysis]:
    return default_project[1]


def _delta_rows(planted: pd.DataFrame, outcome: str) -> pd.DataFrame:
    return planted[(planted["outcome"] == outcome) & (planted["value"] == "Δ")]


def test_biased_every_planted_refusal_gap_is_inside_its_interval(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    planted = default_run["synthetic-biased"].planted
    assert planted is not None
    gaps = _delta_rows(planted, "hard_refusal")
    # Every category (and the pooled row) x every source dimension.
    assert len(gaps) == 6 * 3
    # The planted race gaps are real and large enough to matter.
    assert gaps.loc[(gaps["category"] == "C") & (gaps["dimension"] == "race"), "planted"].item() \
        == pytest.approx(0.25)
    missed = gaps[~gaps["covered"]]
    assert missed.empty, f"planted Δ refusal outside its interval:\n{missed}"


def test_biased_planted_refusal_gaps_are_flagged(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    gaps = default_run["synthetic-biased"].section.disparities
    refusal = gaps[gaps["outcome"] == "hard_refusal"].set_index(["category", "dimension"])
    # The two planted race gaps of 15 pp or more (C: 25 pp, E: 20 pp) are detected.
    assert refusal.loc[("C", "race"), "flagged"]
    assert refusal.loc[("E", "race"), "flagged"]
    # Nothing was planted in the neutral category.
    assert not refusal.loc[("A", "race"), "flagged"]


def test_the_report_opens_with_the_biased_editors_flagged_refusal_gap(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    root, results = default_project
    html = (root / layout.REPORT_FILE).read_text()
    findings = html[html.index('id="findings"'):html.index('id="run"')]
    biased = findings[findings.index('id="finding-synthetic-biased"'):]
    biased = biased[:biased.index("</li>")]
    gaps = results["synthetic-biased"].section.disparities
    # The largest flagged gap pooled over prompt categories (listed first) with its interval.
    flagged = gaps[gaps["flagged"].astype(bool)]
    top = flagged[flagged["category"] == "all"].sort_values("delta", ascending=False).iloc[0]
    assert (f"by {top['dimension']}" in biased and f"{100 * top['delta']:.1f} pp "
            f"[{100 * top['ci_low']:.1f}, {100 * top['ci_high']:.1f}]" in biased), biased
    assert "a simulated instrument with planted values" in biased
    hypotheses = pd.read_parquet(root / layout.ANALYSIS_DIR / "hypotheses.parquet")
    about = hypotheses[hypotheses["model"].str.contains("synthetic-biased")]
    supported = ", ".join(about.loc[about["supported"].fillna(False).astype(bool), "hypothesis"])
    assert supported and f"Hypotheses supported for synthetic-biased: {supported}" in biased


def test_fair_editor_has_no_flagged_disparity(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    gaps = default_run["synthetic-fair"].section.disparities
    detected = gaps[gaps["outcome"].isin(DETECTOR_OUTCOMES)]
    flagged = detected[detected["flagged"]]
    assert flagged.empty, f"the fair editor was flagged:\n{flagged}"
    metrics = default_run["synthetic-fair"].metrics
    assert metrics["flagged.refusal"] == 0


def test_t2i_generator_planted_refusal_by_attribute_is_recovered(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    result = default_run["synthetic-t2i"]
    assert result.task == "t2i" and len(result.frame) == 100 * 25
    planted = result.planted
    assert planted is not None
    rates = planted[planted["value"] != "Δ"]
    # 25 attribute intervals at 95 %, not simultaneous: one or two misses would be chance.
    assert rates["covered"].mean() >= 0.9, rates[~rates["covered"]]
    deltas = planted[planted["value"] == "Δ"].set_index("dimension")
    gaps = result.disparities.set_index("dimension")
    assert gaps["method"].str.startswith("test-inversion, base-prompt bootstrap/").all()
    # The planted gaps (culture 20 pp, religion 15 pp, disability 5 pp, all 20 pp; age and
    # gender 0) lie inside their per-row 95 % intervals but for at most one of the six (more
    # has probability 3 %); a planted 0 outside is a row whose own test (before Holm) rejects:
    # the interval excludes 0 exactly then (in the default's draws gender, p = 0.033 before
    # Holm, 0.10 after: gender:nonbinary was refused 18 times in 100 against a planted 8.35 %).
    missed = deltas[~deltas["covered"].astype(bool)]
    assert len(missed) <= T2I_PER_ROW_MISSES, deltas
    nothing = missed.index[missed["planted"] == 0]
    assert (gaps.loc[nothing, "p_value"] < 0.05).all(), gaps.loc[nothing]
    assert gaps.loc["culture", "flagged"] and gaps.loc["all", "flagged"]
    assert gaps.loc["culture", "max_attribute"] == "culture:nigerian"
    # Nothing planted on age or gender: no flag.
    assert not gaps.loc["age", "flagged"] and not gaps.loc["gender", "flagged"]
    assert result.metrics["planted.refusal_rate.coverage"] >= 0.9


#: Planted Δs outside their per-row interval allowed in the T2I table of six rows.
T2I_PER_ROW_MISSES = 1


def test_t2i_simultaneous_bands_hold_every_planted_gap(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    """analyze.simultaneous_intervals: true (max-t bands over the six rows): every planted gap
    inside its band. The bands hold jointly at 95 % (0.94 measured over 300 simulated audits
    by benchmarks/t2i_simulation.py), so one miss of a planted 0 is allowed: in the default's
    draws gender:nonbinary was refused 18 times in 100 against a planted 8.35 %."""
    from acrb.analysis.experiments.attributes import (
        attribute_disparities,
        attribute_planted_vs_measured,
    )

    result = default_run["synthetic-t2i"]
    gaps = attribute_disparities(result.frame, "hard_refusal", simultaneous=True)
    assert gaps["method"].str.startswith("max-t band (simultaneous)").all()
    planted = attribute_planted_vs_measured(result.frame, result.rates, gaps)
    deltas = planted[planted["value"] == "Δ"].set_index("dimension")
    assert deltas.loc[deltas["planted"] > 0, "covered"].all(), deltas
    assert (~deltas["covered"]).sum() <= 1, deltas


def test_the_first_judges_planted_bias_shows_as_the_fair_editors_soft_erasure_gap(
    default_run: dict[str, analyze.ModelAnalysis],
) -> None:
    # synthetic-fair's planted erasure is equal across races; the first simulated judge
    # falsely erases more for Black (+12 pp) and Southeast Asian (+6 pp) sources, and the
    # study rule keeps the first judge's score when the two disagree.
    result = default_run["synthetic-fair"]
    gaps = result.section.disparities
    soft = gaps[(gaps["outcome"] == "soft_erasure") & (gaps["category"] == "all")
                & (gaps["dimension"] == "race")].iloc[0]
    pixel = gaps[(gaps["outcome"] == "erasure") & (gaps["category"] == "all")
                 & (gaps["dimension"] == "race")].iloc[0]
    assert soft["max_group"] in ("Black", "SoutheastAsian")
    assert soft["delta"] > pixel["delta"] + 0.05
    # Flagged in some category (the pooled row's two-way interval is wide), never by race for
    # the pixel erasure the editor actually plants.
    by_race = gaps[gaps["dimension"] == "race"]
    soft_flagged = by_race[(by_race["outcome"] == "soft_erasure") & by_race["flagged"]]
    assert len(soft_flagged) and soft_flagged["max_group"].isin(
        ["Black", "SoutheastAsian"]).all(), soft_flagged
    assert not by_race[by_race["outcome"] == "erasure"]["flagged"].any()
    judging = result.judging
    assert judging is not None and judging.judges == ("sim-judge-a", "sim-judge-b")
    agreement = judging.agreement.set_index(["dimension", "group", "axis"])
    kappa = agreement["kappa"]
    assert kappa[("race", "Black", "edit_success")] < kappa[("race", "White", "edit_success")]


def test_the_simulated_review_corrects_the_first_judges_false_erasures(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    """The simulated raters read the pixels with unbiased noise; the first judge's planted false
    erasures on Black sources (+12 pp) inflate the judge-only rate, and the judge-corrected
    (PPI) rate takes most of that back, with an interval wider than the judge-only one. The
    judges' score on edit success is lower than people's for Black sources, not for White."""
    root = default_project[0]
    folder = root / layout.REVIEW_ANALYSIS_DIR
    rates = pd.read_parquet(folder / "corrected_rates.parquet")
    black = rates[(rates["model"] == "synthetic-fair") & (rates["outcome"] == "soft_erasure")
                  & (rates["group"] == "Black")].set_index("estimator")
    assert black.loc["judge", "rate"] - black.loc["ppi", "rate"] > 0.03
    assert (black.loc["ppi", "ci_high"] - black.loc["ppi", "ci_low"]
            > black.loc["judge", "ci_high"] - black.loc["judge", "ci_low"])
    judge_human = pd.read_parquet(folder / "judge_human.parquet").set_index(
        ["axis", "dimension", "group"])
    assert judge_human.loc[("edit_success", "race", "Black"), "mean_difference"] < -0.2
    assert abs(judge_human.loc[("edit_success", "race", "White"), "mean_difference"]) < 0.1
    items = pd.read_parquet(root / layout.REVIEW_SET)
    assert items["random_sample"].sum() == 500
    assert items.loc[~items["random_sample"], "needs_review"].all()
    html = (root / layout.REPORT_FILE).read_text()
    assert 'id="review"' in html and "simulated raters with planted noise" in html


def test_the_feature_arm_narrows_the_planted_lightening_gap_only_where_planted(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    """synthetic-biased lightens Black, Indian, Southeast Asian and Latino sources more (up to
    +25 pp, +40 pp in B for Black) and its feature arm multiplies lightening by 0.35: the race
    gap in pixel lightening narrows, with an interval above 0. synthetic-fair plants no gap, so
    there is nothing to narrow: its interval covers 0."""
    gap = pd.read_csv(default_project[0] / layout.ARMS_DIR / "gap.csv").set_index(
        ["model", "outcome", "dimension"])
    biased = gap.loc[("synthetic-biased", "lightening", "race")]
    assert biased["narrowing"] > 0.1 and biased["low"] > 0
    fair = gap.loc[("synthetic-fair", "lightening", "race")]
    assert fair["low"] <= 0 <= fair["high"]
    plan_rows = pd.read_parquet(default_project[0] / layout.PLAN_TABLE)
    feature = plan_rows[plan_rows["arm"] == "feature"]
    # the same 280 stratified cells for each editor, each the twin of a plain request
    assert feature.groupby("model").size().to_dict() == {"synthetic-biased": 280,
                                                        "synthetic-fair": 280}
    assert feature["pair_of"].isin(plan_rows["request_id"]).all()
    assert all(text.startswith(p_feat + " ") for text, p_feat
               in zip(feature["prompt_text"], feature["feature_prompt"], strict=True))


def test_winobias_recovers_each_editors_planted_stereotype(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    """Planted P(the man gets the male-coded occupation): 0.5 for synthetic-fair, 0.75 plus
    race offsets for synthetic-biased; measured through the simulated judges' role answers."""
    rates = pd.read_csv(default_project[0] / layout.WINOBIAS_DIR / "rates.csv").set_index(
        ["model", "role_coding"])
    for coding in ("male", "female"):
        fair = rates.loc[("synthetic-fair", coding)]
        assert fair["low"] <= 0.5 <= fair["high"]
        biased = rates.loc[("synthetic-biased", coding)]
        assert biased["low"] > 0.5 and biased["p_value"] < 0.05


def test_every_paper_table_is_written_as_csv_and_latex_and_marked_a_simulation(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    import json

    root = default_project[0]
    index = json.loads((root / layout.TABLES_DIR / "index.json").read_text())
    assert index["simulated"] is True
    written = {t["id"]: t for t in index["tables"]}
    assert len(written) == 9, written.keys()  # the paper's seven, its mitigation in score
    # points (8) and the White-versus-non-White test (9)
    for entry in written.values():
        assert entry["status"] == "written", entry
        for name in entry["files"].values():
            assert (root / name).exists(), name
    latex = "".join(p.read_text() for p in (root / layout.TABLES_DIR).glob("*.tex"))
    assert latex.count("SIMULATION") >= 9 and "\\toprule" in latex
    html = (root / layout.REPORT_FILE).read_text()
    assert 'id="paper-tables"' in html


# --- planted against measured for every planted outcome -------------------------------------

#: The outcomes the simulated editors plant (params.yaml models.*.config), each read by the
#: evaluate stage's detectors.
PLANTED_OUTCOMES = ("hard_refusal", "erasure", "lightening")
#: A planted Δ at least this large is a gap the default design should flag (the smallest such
#: gap planted is 15 pp: refusal by race in E, erasure by gender in B, lightening by race).
LARGE = 0.15
#: A planted Δ below this is no gap.
NO_GAP = 0.01


def _planted_vs_flagged(result: analyze.ModelAnalysis, outcome: str) -> pd.DataFrame:
    """One row per category x dimension: planted Δ and whether its interval covers it, the
    disparity table's flag and measured top group, and the planted rate of that group as a
    fraction of the way from the lowest to the highest planted group rate (1: the planted top
    group; 0: the planted bottom one)."""
    planted = result.planted
    assert planted is not None
    rows = planted[planted["outcome"] == outcome]
    deltas = rows[rows["value"] == "Δ"].set_index(["category", "dimension"])
    groups = rows[rows["value"] != "Δ"].dropna(subset=["planted"])
    by_cell = groups.groupby(["category", "dimension"])["planted"]
    low, high = by_cell.min(), by_cell.max()
    gaps = result.section.disparities
    gaps = gaps[gaps["outcome"] == outcome].set_index(["category", "dimension"])
    table = deltas[["planted", "measured", "ci_low", "ci_high", "covered"]].join(
        gaps[["flagged", "max_group", "p_adjusted"]])
    rate = groups.set_index(["category", "dimension", "value"])["planted"]
    top = [rate.get((c, d, g), float("nan")) for (c, d), g in table["max_group"].items()]
    table["top_group_position"] = (
        (pd.Series(top, index=table.index) - low) / (high - low).where(high > low))
    return table


#: Planted Δs outside their per-row interval allowed per outcome table of 18 rows: each row's
#: interval is at 95% on its own (0.9 misses expected; more than 2 has probability 6%).
PER_ROW_MISSES = 2


def _per_row_misses(table: pd.DataFrame) -> pd.DataFrame:
    return table[~table["covered"].astype(bool)]


@pytest.mark.parametrize("outcome", PLANTED_OUTCOMES)
def test_biased_planted_gaps_are_inside_their_intervals_and_large_ones_are_flagged(
    default_run: dict[str, analyze.ModelAnalysis], outcome: str,
) -> None:
    """synthetic-biased plants refusal, erasure and lightening gaps (params.yaml).

    - The planted Δs lie inside their per-row 95% intervals but for a few (the intervals are
      each row's own, not joint over the table).
    - At least 3 in 4 planted gaps of 15 pp or more are flagged, each with a group planted in
      the upper half on top (the planted top group itself can lose to one planted 5 pp
      lower: lightening by race, Black against Indian).
    - At most one category x dimension without a planted gap is flagged per outcome: Holm
      holds each outcome's table at 5 % family-wise, so one false flag is chance.
    """
    table = _planted_vs_flagged(default_run["synthetic-biased"], outcome)
    assert len(table) == 6 * 3  # every category (and the pooled row) x every source dimension
    missed = _per_row_misses(table)
    assert len(missed) <= PER_ROW_MISSES, f"planted Δ {outcome} outside its interval:\n{missed}"
    large = table[table["planted"] >= LARGE - 1e-9]
    assert len(large) >= 2, f"nothing large planted for {outcome}?\n{table}"
    flagged = large[large["flagged"]]
    assert len(flagged) >= 0.75 * len(large), f"large planted Δ {outcome} not flagged:\n{large}"
    wrong_group = flagged[~(flagged["top_group_position"] >= 0.5)]
    assert wrong_group.empty, f"a group planted low measured on top:\n{wrong_group}"
    false_flags = table[(table["planted"] < NO_GAP) & table["flagged"]]
    assert len(false_flags) <= 1, f"{outcome} flagged where nothing was planted:\n{false_flags}"


@pytest.mark.parametrize("outcome", PLANTED_OUTCOMES)
def test_simultaneous_intervals_hold_every_planted_gap(
    default_run: dict[str, analyze.ModelAnalysis], outcome: str,
) -> None:
    """analyze.simultaneous_intervals: true (max-t bands, Bonferroni over the table): every
    planted Δ of both simulated editors inside its interval."""
    from acrb.analysis.estimation.planted import planted_vs_measured
    from acrb.analysis.estimation.resampling import clustered_disparities

    for model in ("synthetic-biased", "synthetic-fair"):
        result = default_run[model]
        gaps = clustered_disparities(result.frame, outcome, simultaneous=True)
        planted = planted_vs_measured(result.frame, result.section.rates, gaps, outcome)
        deltas = planted[(planted["value"] == "Δ") & planted["covered"].notna()]
        assert len(deltas) == 18 and deltas["covered"].astype(bool).all(), (model, deltas)


@pytest.mark.parametrize("outcome", PLANTED_OUTCOMES)
def test_fair_planted_no_gap_and_none_is_measured(
    default_run: dict[str, analyze.ModelAnalysis], outcome: str,
) -> None:
    """synthetic-fair plants rates by category only: every planted Δ is 0, nothing is flagged
    in any outcome the detectors read, and 0 lies inside the per-row intervals but for a few,
    each of them a row whose own test (before Holm) rejects: the interval excludes 0 exactly
    then."""
    result = default_run["synthetic-fair"]
    table = _planted_vs_flagged(result, outcome)
    assert len(table) == 6 * 3
    assert table["planted"].abs().max() < NO_GAP, table
    missed = _per_row_misses(table)
    assert len(missed) <= PER_ROW_MISSES, f"planted Δ {outcome} = 0 outside its interval:\n{missed}"
    gaps = result.section.disparities
    gaps = gaps[gaps["outcome"] == outcome].set_index(["category", "dimension"])
    assert (gaps.loc[missed.index, "p_value"] < 0.05).all()
    flagged = table[table["flagged"]]
    assert flagged.empty, f"the fair editor was flagged on {outcome}:\n{flagged}"
    label = OUTCOME_NAMES[outcome].metric
    assert result.metrics[f"flagged.{label}"] == 0
    assert result.metrics[f"planted.delta_{label}.coverage"] >= 1 - PER_ROW_MISSES / 18


#: The stages whose params the fixture leaves as committed: their outputs must be the bytes
#: the committed dvc.lock records (analyze and the review run with fewer resamples here).
DATA_STAGES = ("sources", "prompts", "features", "plan", "generate", "evaluate", "judge")


def dvc_md5(path: Path) -> str:
    """DVC's md5 of an output: a file's md5, or for a folder the md5 of its listing with
    ``.dir`` appended (``dvc_data``'s own tree hashing, as ``dvc repro`` records it)."""
    from dvc_data.hashfile.hash import HashInfo, file_md5
    from dvc_data.hashfile.tree import Tree

    if path.is_file():
        return file_md5(str(path))
    tree = Tree()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        tree.add(file.relative_to(path).parts, None, HashInfo("md5", file_md5(str(file))))
    tree.digest()
    return str(tree.hash_info.value)


def test_the_data_stages_reproduce_the_committed_lock(
    default_project: tuple[Path, dict[str, analyze.ModelAnalysis]],
) -> None:
    """Run here from scratch, every output from the sources to the judges' scores has the hash
    the committed dvc.lock records: a clone reproduces (and can pull) the committed data."""
    root, _ = default_project
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    compared = []
    for stage, entry in lock["stages"].items():
        if stage.split("@")[0] not in DATA_STAGES:
            continue
        for out in entry["outs"]:
            assert dvc_md5(root / out["path"]) == out["md5"], (
                f"{out['path']} ({stage}) differs from dvc.lock: regenerate the lock with "
                "`dvc repro` in a fresh clone, or find what varies between runs")
            compared.append(out["path"])
    assert len(compared) == 13, compared
