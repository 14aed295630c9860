"""Judge-corrected rates (acrb.analysis.agreement.corrected): PPI against ppi_py and its formula,
the labelled set (random-sample items only, the judge's own outcome rule on the human consensus),
the tables, and a short run of the coverage simulation in benchmarks/ppi_coverage.py."""

from __future__ import annotations

import importlib.util
import math
import sys
from itertools import product
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest
from ppi_py import ppi_mean_ci
from statsmodels.stats.proportion import confint_proportions_2indep

from acrb.analysis.agreement.corrected import (
    CORRECTED_DELTA_COLUMNS,
    CORRECTED_RATE_COLUMNS,
    corrected_deltas,
    corrected_rates,
    count_rate,
    delta,
    human_outcomes,
    labelled_frame,
    power_tuned_lambda,
    ppi_rate,
)
from acrb.config import OutcomeRule
from acrb.errors import InputDataError

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ppi_coverage.py"
SOFT_ERASURE = OutcomeRule(axis="edit_success", at_most=2)


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ppi_coverage", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def biased_judge(n: int, big_n: int, rate: float, false_positive: float, seed: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Truth and judge labels of n labelled and big_n unlabelled outputs."""
    rng = np.random.default_rng(seed)
    truth = rng.random(n + big_n) < rate
    says = np.where(truth, rng.random(n + big_n) < 0.95, rng.random(n + big_n) < false_positive)
    return (truth[:n].astype(float), says[:n].astype(float), says[n:].astype(float),
            truth[n:].astype(float))


def test_ppi_rate_is_ppi_py_with_its_power_tuning() -> None:
    y, yhat, unl, _ = biased_judge(120, 1500, 0.25, 0.15, seed=1)
    estimate = ppi_rate(y, yhat, unl, 0.9)
    low, high = ppi_mean_ci(y, yhat, unl, alpha=0.1)  # ppi_py's own λ
    assert estimate.ci_low == pytest.approx(float(low[0]), abs=1e-12)
    assert estimate.ci_high == pytest.approx(float(high[0]), abs=1e-12)
    assert 0 < estimate.lam < 1
    assert estimate.lam == power_tuned_lambda(y, yhat, unl)


def test_plain_ppi_is_the_judge_rate_plus_the_rectifier() -> None:
    y, yhat, unl, _ = biased_judge(100, 900, 0.3, 0.2, seed=2)
    estimate = ppi_rate(y, yhat, unl, lam=1.0)
    rectifier = (y - yhat).mean()
    assert rectifier < 0  # the judge over-reports: the rectifier takes it back
    assert estimate.rate == pytest.approx(unl.mean() + rectifier)
    se = math.sqrt(unl.var() / len(unl) + (y - yhat).var() / len(y))
    assert estimate.se == pytest.approx(se)
    assert estimate.ci_high - estimate.ci_low == pytest.approx(2 * 1.959964 * se, rel=1e-5)


def test_ppi_removes_the_judge_bias() -> None:
    y, yhat, unl, hidden = biased_judge(300, 20_000, 0.2, 0.15, seed=3)
    truth = np.concatenate([y, hidden]).mean()
    estimate = ppi_rate(y, yhat, unl)
    judge_only = count_rate("judge", np.concatenate([yhat, unl]), 300, 20_000)
    assert judge_only.ci_low > truth + 0.05  # the judge alone is far off
    assert estimate.ci_low <= truth <= estimate.ci_high
    assert estimate.ci_high - estimate.ci_low < 0.15


def test_degenerate_inputs() -> None:
    assert math.isnan(ppi_rate([1.0], [1.0], [0.0, 1.0]).rate)
    alone = ppi_rate([1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0], [])
    assert alone.rate == 0.75 and "human labels alone" in alone.note
    constant_judge = ppi_rate([1.0, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 10)
    assert constant_judge.lam == 0 and constant_judge.rate == 0.25
    with pytest.raises(ValueError, match="judge labels"):
        ppi_rate([1.0, 0.0], [1.0], [0.0])


def test_delta_intervals() -> None:
    a = ppi_rate(*biased_judge(100, 800, 0.2, 0.02, seed=4)[:3])
    b = ppi_rate(*biased_judge(100, 800, 0.25, 0.15, seed=5)[:3])
    d = delta(a, b)
    assert d.delta == pytest.approx(a.rate - b.rate)
    assert d.se == pytest.approx(math.hypot(a.se, b.se))  # independent groups: variances add
    assert d.ci_high - d.ci_low == pytest.approx(2 * 1.959964 * d.se, rel=1e-5)
    ha, hb = count_rate("human", np.ones(10), 10, 0), count_rate("human", np.zeros(20), 20, 0)
    newcombe = confint_proportions_2indep(10, 10, 0, 20, method="newcomb", compare="diff")
    assert (delta(ha, hb).ci_low, delta(ha, hb).ci_high) == pytest.approx(newcombe)
    with pytest.raises(ValueError, match="cannot take"):
        delta(a, ha)


def review_tables(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """An analysis frame with a judge outcome for 7 x 30 outputs, review items for the first
    12 of each race (10 random-sample items, 2 added for needs_review), and ratings."""
    rng = np.random.default_rng(seed)
    frame, items, ratings = [], [], []
    for race, i in product(("Black", "White", "Indian"), range(30)):
        request = f"{race}-{i}"
        erased = rng.random() < 0.3
        judge = erased or (race == "Black" and rng.random() < 0.3)
        frame.append({"request_id": request, "status": "ok", "race": race,
                      "gender": "Female", "age": "20s", "soft_erasure": judge})
        if i < 12:
            items.append({"item_id": f"item-{request}", "request_id": request,
                          "paired_request_id": None, "random_sample": i < 10})
            score = 1 if erased else 4
            for rater in "abc":
                ratings.append({"rater": rater, "item_id": f"item-{request}",
                                "output": "edited", "repeat": False, "edit_success": score})
    return pd.DataFrame(frame), pd.DataFrame(items), pd.DataFrame(ratings)


def test_human_labels_come_from_random_sample_items_only() -> None:
    frame, items, ratings = review_tables()
    human = human_outcomes(ratings, items, SOFT_ERASURE)
    assert len(human) == 30  # 10 random-sample items per race; needs_review ones left out
    assert not human["request_id"].str.endswith(("-10", "-11")).any()
    consensus = ratings.groupby("item_id")["edit_success"].median()
    expected = (consensus.loc["item-" + human["request_id"]] <= 2).to_numpy()
    assert (human["human"].to_numpy(dtype=bool) == expected).all()
    labelled = labelled_frame(frame, "soft_erasure", human)
    assert labelled["human"].notna().sum() == 30 and len(labelled) == 90


def test_corrected_rate_and_delta_tables() -> None:
    frame, items, ratings = review_tables()
    labelled = labelled_frame(frame, "soft_erasure", human_outcomes(ratings, items,
                                                                     SOFT_ERASURE))
    rates = corrected_rates(labelled, "soft_erasure", dimensions=("race",))
    assert list(rates.columns) == list(CORRECTED_RATE_COLUMNS)
    assert len(rates) == 3 * 4  # all + 3 races, three estimators each
    black = rates[(rates["group"] == "Black")].set_index("estimator")
    assert black.loc["judge", "n_labelled"] == 10 and black.loc["judge", "n_unlabelled"] == 20
    # The judge over-reports on Black sources; the human and PPI estimates do not.
    assert black.loc["ppi", "rate"] < black.loc["judge", "rate"]
    deltas = corrected_deltas(labelled, "soft_erasure", "race", pair=("Black", "White"))
    assert list(deltas.columns) == list(CORRECTED_DELTA_COLUMNS)
    assert list(deltas["estimator"]) == ["judge", "human", "ppi"]
    by = deltas.set_index("estimator")
    assert by.loc["ppi", "delta"] == pytest.approx(
        black.loc["ppi", "rate"]
        - rates[(rates["group"] == "White") & (rates["estimator"] == "ppi")]["rate"].iloc[0])
    extremes = corrected_deltas(labelled, "soft_erasure", "race")
    assert (extremes["delta"].iloc[2] >= 0) and "max - min" in extremes["note"].iloc[0]
    with pytest.raises(InputDataError, match="Latino"):
        corrected_deltas(labelled, "soft_erasure", "race", pair=("Black", "Latino"))


def test_two_human_labels_for_one_request_refused() -> None:
    frame, _, _ = review_tables()
    human = pd.DataFrame({"request_id": ["Black-0", "Black-0"],
                          "human": pd.array([True, False], dtype="boolean")})
    with pytest.raises(InputDataError, match="two human labels"):
        labelled_frame(frame, "soft_erasure", human)


def test_coverage_simulation_short_run() -> None:
    """The benchmark's simulation, fewer runs, looser floors: the judge-only Δ misses the truth,
    PPI covers it and is narrower than the human labels alone."""
    module = load_benchmark()
    result = module.simulate(120, seed=11)
    assert result["coverage"]["judge"] < 0.2
    assert result["coverage"]["ppi"] >= 0.87
    assert result["mean_width"]["ppi"] < 0.8 * result["mean_width"]["human"]
    assert abs(result["mean_delta"]["ppi"] - result["true_delta"]) < 0.015


def test_a_group_whose_labels_all_agree_never_gets_a_zero_width_interval() -> None:
    """36 labelled outputs, all negative and all agreeing with a judge that flags 8% of the
    other outputs: the labelled variance is 0 by chance, and the interval must still be as
    wide as the labels' own uncertainty (Wilson), not [x, x]."""
    from acrb.analysis.agreement.corrected import ppi_rate
    from acrb.analysis.estimation.rates import wilson_interval

    y = np.zeros(36)
    yhat = np.zeros(36)
    unlabelled = (np.arange(500) % 12 == 0).astype(float)
    est = ppi_rate(y, yhat, unlabelled)
    low, high = wilson_interval(np.array([0]), np.array([36]), 0.95)
    assert est.ci_high - est.ci_low > 0
    assert est.se > 0 and "widened" in est.note
    assert abs((est.ci_high - est.rate) - (high[0] - low[0]) / 2) < 1e-9 or est.ci_low == 0.0
    assert est.ci_high >= (high[0] - low[0]) / 2 - 1e-9


def test_the_extreme_pair_gets_an_interval_simultaneous_over_all_pairs() -> None:
    """Without a named pair, Δ = max − min of k groups is picked from the data; its interval is
    the named-pair interval at the Bonferroni level over the k(k − 1)/2 pairs."""
    from acrb.analysis.agreement.corrected import corrected_deltas

    rng = np.random.default_rng(3)
    rows = []
    for race, rate in (("Black", 0.3), ("White", 0.1), ("Latino", 0.2)):
        for i in range(400):
            truth = bool(rng.random() < rate)
            rows.append({"request_id": f"{race}{i}", "race": race, "gender": "Female",
                         "age": "20s", "judge": truth if rng.random() > 0.1 else not truth,
                         "human": truth if i < 60 else pd.NA})
    labelled = pd.DataFrame(rows).astype({"human": "boolean"})
    picked = corrected_deltas(labelled, "soft_erasure", "race").set_index("estimator")
    a, b = picked.loc["ppi", "group_a"], picked.loc["ppi", "group_b"]
    named = corrected_deltas(labelled, "soft_erasure", "race", pair=(a, b)).set_index(
        "estimator")
    bonferroni = corrected_deltas(labelled, "soft_erasure", "race", pair=(a, b),
                                  confidence=1 - 0.05 / 3).set_index("estimator")
    for estimator in ("judge", "human", "ppi"):
        assert picked.loc[estimator, "delta"] == pytest.approx(named.loc[estimator, "delta"])
        width = picked.loc[estimator, "ci_high"] - picked.loc[estimator, "ci_low"]
        assert width > named.loc[estimator, "ci_high"] - named.loc[estimator, "ci_low"]
        assert picked.loc[estimator, "ci_low"] == pytest.approx(
            bonferroni.loc[estimator, "ci_low"])
        assert picked.loc[estimator, "ci_high"] == pytest.approx(
            bonferroni.loc[estimator, "ci_high"])
    assert "Bonferroni over 3 pairs" in picked.loc["ppi", "note"]
