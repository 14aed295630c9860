"""The audit's statistics, by concern; the method write-ups are in docs/statistics.md.

What every analysis reads, here: :mod:`~acrb.analysis.outcomes` (the outcomes and their
names), :mod:`~acrb.analysis.frame` (the analysis frame, which rows count, groups),
:mod:`~acrb.analysis.inputs` (the frame built from a model's records) and
:mod:`~acrb.analysis.defaults` (resampling defaults shared with params).

The concerns, one subpackage each:
    :mod:`~acrb.analysis.estimation` (rates, Δ and its intervals, power, planted vs measured),
    :mod:`~acrb.analysis.tests` (contingency, GEE, equivalence, the declared hypotheses, Holm),
    :mod:`~acrb.analysis.agreement` (judges' tables, raters' and judges' agreement,
    judge-corrected rates), :mod:`~acrb.analysis.experiments` (the feature arm, WinoBias,
    text-to-image attributes, SCS), and :mod:`~acrb.analysis.outputs` (tables, figures, the
    report, the paper's tables), which only assembles and renders: no statistics module imports
    it (tests/test_layering.py).
"""
