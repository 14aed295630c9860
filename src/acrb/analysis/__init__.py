"""The audit's statistics, one module per job; the method write-ups are in docs/statistics.md.

What an analysis reads and which requests count:
    :mod:`~acrb.analysis.outcomes` (the outcomes and their names),
    :mod:`~acrb.analysis.frame` (the analysis frame, usable rows, groups),
    :mod:`~acrb.analysis.defaults` (resampling defaults shared with params).
Estimates and intervals:
    :mod:`~acrb.analysis.rates` (group rates, Wilson),
    :mod:`~acrb.analysis.resampling` (cluster bootstrap and permutation test of Δ: the table
    the pipeline reports), :mod:`~acrb.analysis.disparity` (Δ counting requests as
    independent), :mod:`~acrb.analysis.congruence` (SCS),
    :mod:`~acrb.analysis.planted` (planted against measured, for simulated models).
Hypothesis tests:
    :mod:`~acrb.analysis.contingency` (chi-square, Fisher, CMH),
    :mod:`~acrb.analysis.gee` (GEE clustered on source image),
    :mod:`~acrb.analysis.judge_scores` (Kruskal-Wallis with Dunn, ordinal model),
    :mod:`~acrb.analysis.equivalence` (TOST), :mod:`~acrb.analysis.power` (design effect,
    minimum detectable gap), :mod:`~acrb.analysis.pvalues` (test results, Holm).
Assembling and rendering:
    :mod:`~acrb.analysis.section` (one model's tables and figures),
    :mod:`~acrb.analysis.hypotheses` (the declared hypotheses table),
    :mod:`~acrb.analysis.figures`, :mod:`~acrb.analysis.report` (HTML),
    :mod:`~acrb.analysis.latex` (LaTeX); the last three only render.
"""
