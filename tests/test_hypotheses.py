"""The hypotheses table and the LaTeX tables, on audits with known planted answers."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from acrb.analysis.estimation.resampling import clustered_disparities
from acrb.analysis.experiments.congruence import scs
from acrb.analysis.outputs.latex import disparities_table, hypotheses_table
from acrb.analysis.outputs.section import model_tests
from acrb.analysis.tests.hypotheses import HYPOTHESIS_COLUMNS, evaluate_hypotheses
from acrb.config import AnalyzeParams, HypothesisSpec
from acrb.demographics import RACES


def audit(rates: dict[tuple[str, str], float], seed: int, prompts: int = 8) -> pd.DataFrame:
    """7 races x 2 genders x 3 ages sources, ``prompts`` prompts in categories A, B and C;
    refusal probability by (category, race) from ``rates`` (default 0.1). Half of the races
    are stereotype-congruent with the C prompts."""
    rng = np.random.default_rng(seed)
    rows = []
    for race, gender, age in itertools.product(RACES, ("Female", "Male"), ("20s", "40s", "60s")):
        source = f"{race}-{gender}-{age}"
        for category in "ABC":
            for j in range(prompts):
                p = rates.get((category, race), 0.1)
                refused = bool(rng.random() < p)
                congruence = "neutral" if category != "C" else (
                    "congruent" if race in RACES[:3] else "incongruent")
                rows.append({
                    "request_id": f"{source}-{category}{j}", "source_id": source,
                    "prompt_id": f"{category}{j}", "category": category,
                    "congruence": congruence, "seed": 0, "race": race, "gender": gender,
                    "age": age, "status": "ok", "hard_refusal": refused,
                    "erasure": None if refused else bool(rng.random() < 0.1),
                    "lightening": None if refused else False,
                })
    frame = pd.DataFrame(rows)
    for column in ("hard_refusal", "erasure", "lightening"):
        frame[column] = frame[column].astype("boolean")
    return frame


SPECS = {
    "H1": HypothesisSpec(claim="A is equal", test="equivalence", category="A", margin=0.4),
    "H1-strict": HypothesisSpec(claim="A is equal", test="equivalence", category="A",
                                margin=0.001),
    "H2": HypothesisSpec(claim="B differs", test="disparity", category="B"),
    "H2-null": HypothesisSpec(claim="A differs", test="disparity", category="A"),
    "H3": HypothesisSpec(claim="C gatekeeping", test="scs", category="C"),
    "H5": HypothesisSpec(claim="models differ", test="model_interaction", category="B"),
}
CFG = AnalyzeParams(bootstrap=300, permutations=300, hypotheses=SPECS)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    # Model "biased": Black refused 90% of B prompts; incongruent sources refused more in C.
    biased = audit({("B", "Black"): 0.9, **{("C", r): 0.5 for r in RACES[3:]}}, seed=1)
    fair = audit({}, seed=2)
    frames = {"biased": biased, "fair": fair}
    gaps = {
        name: pd.concat([clustered_disparities(f, o, n_boot=300, n_perm=300, seed=3)
                         for o in ("hard_refusal", "erasure")], ignore_index=True)
        for name, f in frames.items()
    }
    return evaluate_hypotheses(frames, gaps, CFG).set_index(["hypothesis", "model"])


def test_planted_gap_is_supported_and_null_is_not(table: pd.DataFrame) -> None:
    assert table.loc[("H2", "biased"), "supported"]
    assert "Black" in table.loc[("H2", "biased"), "estimate_label"]
    assert not table.loc[("H2", "fair"), "supported"]
    assert not table.loc[("H2-null", "biased"), "supported"]


def test_not_supported_gap_reports_the_detectable_gap(table: pd.DataFrame) -> None:
    row = table.loc[("H2", "fair")]
    assert 0 < row["mde"] < 1
    assert "detectable gap" in row["verdict"]


def test_equivalence_needs_a_margin_the_data_can_support(table: pd.DataFrame) -> None:
    assert table.loc[("H1", "fair"), "supported"]
    assert not table.loc[("H1-strict", "fair"), "supported"]
    assert "cannot be excluded" in table.loc[("H1-strict", "fair"), "verdict"]
    # The verdicts name each hypothesis's own margin (the table keeps it for them).
    assert table.loc[("H1", "fair"), "verdict"] == "supported: every group gap is below 40.0 pp"
    assert table.loc[("H1-strict", "fair"), "verdict"].startswith("not shown: a gap of 0.1 pp")


def test_scs(table: pd.DataFrame) -> None:
    assert table.loc[("H3", "biased"), "estimate"] > 0
    assert table.loc[("H3", "biased"), "supported"]


def test_model_interaction_is_one_row_across_models(table: pd.DataFrame) -> None:
    interaction = table.xs("H5", level="hypothesis")
    assert len(interaction) == 1 and interaction.index[0] == "biased, fair"
    assert 0 <= interaction["p_value"].iloc[0] <= 1


def test_model_interaction_found_when_models_treat_races_differently() -> None:
    # One model refuses two races 60% of the time in every category, the other treats all
    # races alike: the model x race interaction is what H5 claims. The GEE score test is
    # conservative with 6 sources per race, so the planted difference is large.
    strong = {(c, r): 0.6 for c in "ABC" for r in ("Black", "White")}
    frames = {"biased": audit(strong, seed=1), "fair": audit({}, seed=2)}
    specs = {"H5": HypothesisSpec(claim="models differ", test="model_interaction")}
    gaps = {m: clustered_disparities(f, "hard_refusal", n_boot=100, n_perm=100)
            for m, f in frames.items()}
    result = evaluate_hypotheses(frames, gaps, AnalyzeParams(bootstrap=100, permutations=100,
                                                             hypotheses=specs))
    assert result["p_value"].item() < 0.01
    assert bool(result["supported"].item())


def test_scs_interval_resamples_the_units_params_name() -> None:
    # analyze.resample applies to every interval, the SCS of a hypothesis included.
    frame = audit({**{("C", r): 0.5 for r in RACES[3:]}}, seed=1)
    specs = {"H3": SPECS["H3"]}
    gaps = {"m": clustered_disparities(frame, "hard_refusal", n_boot=100, n_perm=100)}
    intervals = {}
    for resample in ("two-way", "sources"):
        cfg = AnalyzeParams(bootstrap=300, permutations=100, hypotheses=specs, resample=resample)
        row = evaluate_hypotheses({"m": frame}, gaps, cfg).iloc[0]
        expected = scs(frame, "hard_refusal", "C", 300, cfg.seed, cfg.confidence,
                       resample=resample)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(
            (expected.ci_low, expected.ci_high))
        intervals[resample] = (row["ci_low"], row["ci_high"])
    assert intervals["two-way"] != intervals["sources"]


def test_holm_over_the_table(table: pd.DataFrame) -> None:
    finite = table["p_value"].notna()
    assert (table.loc[finite, "p_adjusted"] >= table.loc[finite, "p_value"] - 1e-12).all()
    assert table["p_adjusted"].max() <= 1.0


def test_scs_with_zero_baseline_is_not_testable() -> None:
    frame = audit({("A", r): 0.0 for r in RACES}, seed=4)
    gaps = {"m": clustered_disparities(frame, "hard_refusal", n_boot=100, n_perm=100)}
    specs = {"H3": SPECS["H3"]}
    result = evaluate_hypotheses({"m": frame}, gaps,
                                 AnalyzeParams(bootstrap=100, permutations=100,
                                               hypotheses=specs))
    assert result["estimate_label"].item() == "undefined"
    assert result["verdict"].item().startswith("not testable")
    assert pd.isna(result["supported"].item())


def test_hypothesis_about_an_absent_category_is_not_testable() -> None:
    # e.g. the catalog's hypotheses on an audit of the ACRB prompt set, whose categories are
    # safety domains: reported, not a crash.
    frame = audit({}, seed=6)
    frame = frame[frame["category"] == "A"]
    gaps = {"m": clustered_disparities(frame, "hard_refusal", n_boot=100, n_perm=100)}
    result = evaluate_hypotheses({"m": frame}, gaps, AnalyzeParams(
        bootstrap=100, permutations=100, hypotheses={"H2": SPECS["H2"]}))
    assert result["verdict"].item() == "not testable (no requests of category B)"
    assert pd.isna(result["supported"].item())


def test_model_tests_find_the_planted_gap() -> None:
    frame = audit({(c, r): 0.6 for c in "ABC" for r in ("Black", "White")}, seed=5)
    tests = model_tests(frame, alpha=0.05, outcomes=("hard_refusal",))
    race = tests[(tests["dimension"] == "race")].set_index("test")
    assert race.loc["CMH across categories", "p_value"] < 0.01
    assert race.loc["GEE: common group effect", "p_value"] < 0.05
    gender = tests[(tests["dimension"] == "gender")].set_index("test")
    assert gender.loc["CMH across categories", "p_value"] > 0.01
    assert (tests["p_adjusted"].dropna() >= tests["p_value"].dropna() - 1e-12).all()


def test_latex_tables(table: pd.DataFrame) -> None:
    frame = audit({}, seed=6)
    gaps = clustered_disparities(frame, "hard_refusal", n_boot=100, n_perm=100)
    tex = disparities_table(gaps, "my_model", "hard_refusal", 0.95)
    assert tex.count(r"\toprule") == tex.count(r"\midrule") == tex.count(r"\bottomrule") == 1
    assert r"my\_model" in tex and "95\\%" in tex
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0]
    assert body.count(r"\\") == len(gaps)
    hyp = hypotheses_table(table.reset_index())
    assert hyp.count(r"\\") == len(table) + 1  # rows + header
    assert r"$\Delta$" in hyp and "_" not in hyp.replace(r"\_", "").replace("p_{", "")


def test_no_declared_hypotheses_give_an_empty_table_with_every_column() -> None:
    # `analyze.hypotheses: {}` is a valid setting (screening only): the table is empty, not
    # a KeyError on the p-values of no rows.
    frame = audit({}, seed=3)
    gaps = {"m": clustered_disparities(frame, "hard_refusal", n_boot=50, n_perm=50)}
    result = evaluate_hypotheses({"m": frame}, gaps, AnalyzeParams(hypotheses={}))
    assert result.empty and list(result.columns) == list(HYPOTHESIS_COLUMNS)
