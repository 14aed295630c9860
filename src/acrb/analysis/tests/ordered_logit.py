"""statsmodels' proportional-odds model with its logistic cdf evaluated without overhead.

A module of its own so that statsmodels is imported only where an ordinal model is fitted
(:func:`acrb.analysis.agreement.judge_scores.ordinal_model`), not by every module that imports the
judge tables.
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats
from statsmodels.miscmodels.ordinal_model import OrderedModel


class LogitOrderedModel(OrderedModel):
    """``OrderedModel(distr="logit")`` whose cdf is ``scipy.special.expit`` called directly.

    ``scipy.stats.logistic.cdf`` checks its arguments and then applies ``expit`` (0 at −inf,
    1 at +inf, NaN at NaN, as ``expit`` gives), so every likelihood is the same to the bit;
    the checks took about 80 % of a fit's time, spent again on each of the few hundred
    likelihood evaluations of the BFGS fit and of the numerical derivatives of its covariance.
    Any other ``distr`` is left to statsmodels."""

    def cdf(self, x):
        if self.distr is not stats.logistic:
            return super().cdf(x)
        return special.expit(np.asarray(x, dtype=np.float64))
