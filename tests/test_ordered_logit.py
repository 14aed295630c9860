"""The proportional-odds model the judge-score tests fit (:mod:`acrb.analysis.tests.ordered_logit`)
evaluates the logistic cdf with ``scipy.special.expit`` directly: the fit is statsmodels'
``OrderedModel(distr="logit")`` to the last bit, without scipy.stats' argument checks on each
of its few hundred likelihood evaluations (80 % of a fit's time)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.miscmodels.ordinal_model import OrderedModel

from acrb.analysis.tests.ordered_logit import LogitOrderedModel


def _data(seed: int = 3) -> tuple[pd.Series, pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 400
    groups = rng.integers(0, 3, n)
    exog = pd.DataFrame({"b": (groups == 1).astype(float), "c": (groups == 2).astype(float)})
    latent = 0.8 * exog["b"] - 0.5 * exog["c"] + rng.logistic(size=n)
    scores = np.digitize(latent, [-1.5, -0.3, 0.6, 1.8]) + 1
    endog = pd.Series(pd.Categorical(scores, categories=[1, 2, 3, 4, 5], ordered=True))
    return endog, exog, rng.integers(0, 40, n)


def _fit(model_class: type[OrderedModel], endog: pd.Series, exog: pd.DataFrame | None,
         clusters: np.ndarray | None):
    kwargs = {"method": "bfgs", "disp": False, "maxiter": 500}
    if clusters is not None:
        kwargs.update(cov_type="cluster", cov_kwds={"groups": clusters})
    return model_class(endog, exog, distr="logit").fit(**kwargs)


@pytest.mark.parametrize("with_exog", [True, False])
def test_the_fit_is_statsmodels_to_the_bit(with_exog: bool) -> None:
    endog, exog, clusters = _data()
    ours = _fit(LogitOrderedModel, endog, exog if with_exog else None,
                clusters if with_exog else None)
    theirs = _fit(OrderedModel, endog, exog if with_exog else None,
                  clusters if with_exog else None)
    assert np.array_equal(np.asarray(ours.params), np.asarray(theirs.params))
    assert np.array_equal(np.asarray(ours.cov_params()), np.asarray(theirs.cov_params()))
    assert ours.llf == theirs.llf
    assert ours.mle_retvals["fcalls"] == theirs.mle_retvals["fcalls"]


def test_the_cdf_is_expit_at_every_point_the_model_asks() -> None:
    endog, exog, _ = _data()
    model = LogitOrderedModel(endog, exog, distr="logit")
    x = np.array([-np.inf, -800.0, -3.5, -0.0, 0.0, 1e-300, 2.25, 40.0, 800.0, np.inf, np.nan])
    assert np.array_equal(model.cdf(x), stats.logistic.cdf(x), equal_nan=True)
    assert model.cdf(np.float64(0.3)) == stats.logistic.cdf(0.3)


def test_a_fit_does_not_go_through_scipy_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    endog, exog, clusters = _data()

    def checked_cdf(*args, **kwargs):
        raise AssertionError("scipy.stats.logistic.cdf called")

    monkeypatch.setattr(stats.logistic, "cdf", checked_cdf)
    fitted = _fit(LogitOrderedModel, endog, exog, clusters)
    assert np.isfinite(fitted.llf)


def test_another_distribution_is_left_to_statsmodels() -> None:
    endog, exog, _ = _data()
    model = LogitOrderedModel(endog, exog, distr="probit")
    x = np.array([-1.0, 0.0, 2.0])
    assert np.array_equal(model.cdf(x), stats.norm.cdf(x))


@pytest.mark.parametrize("test", ["score", "wald", "lr"])
def test_the_judge_score_tests_fit_it(test: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from acrb.analysis.agreement.judge_scores import ordinal_model
    from tests.test_inference import clustered_frame

    frame = clustered_frame(effects={"White": 0.6}, sources_per_cell=4, rng_seed=32)
    expected = ordinal_model(frame, "judge_score", "race", test=test)

    def checked_cdf(*args, **kwargs):
        raise AssertionError("scipy.stats.logistic.cdf called")

    monkeypatch.setattr(stats.logistic, "cdf", checked_cdf)
    result = ordinal_model(frame, "judge_score", "race", test=test)
    assert np.isfinite(result.statistic) and result.statistic == expected.statistic
    assert result.odds_ratios.equals(expected.odds_ratios)
