"""Default resampling settings: one definition for params and for the analysis functions.

``analyze.bootstrap``, ``analyze.permutations``, ``analyze.seed`` and
``analyze.equivalence_margin`` in params default to these,
and so does every function of :mod:`acrb.analysis` called without them, so a table computed in
Python with the defaults is the table the pipeline writes with its defaults. Why these numbers:
see ``docs/statistics.md#resampling-defaults``.
"""

from __future__ import annotations

#: Cluster-bootstrap resamples per interval.
BOOTSTRAP_RESAMPLES = 2000

#: Permutations per permutation test (of Δ over sources, and of sparse g x 2 tables).
PERMUTATIONS = 2000

#: Seed of every bootstrap and permutation, fixed so that a report is reproducible to the digit.
SEED = 20_261_123

#: Largest gap (rate units) a "no bias" (equivalence) claim allows.
EQUIVALENCE_MARGIN = 0.03
