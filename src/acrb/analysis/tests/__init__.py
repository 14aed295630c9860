"""Hypothesis tests: what a test returns and Holm's adjustment (:mod:`.pvalues`), chi-square,
Fisher and Cochran-Mantel-Haenszel (:mod:`.contingency`), GEE clustered on the source image
(:mod:`.gee`), equivalence by TOST (:mod:`.equivalence`), the proportional-odds fit
(:mod:`.ordered_logit`) and the declared hypotheses H1-H6 (:mod:`.hypotheses`)."""
