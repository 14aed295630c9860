"""Estimates and their intervals: group rates (:mod:`.rates`), Δ counting requests as
independent (:mod:`.disparity`), the clustered Δ table the pipeline reports, by cluster
bootstrap and permutation (:mod:`.resampling`), design effects and the smallest detectable gap
(:mod:`.power`), and planted against measured values for simulated models (:mod:`.planted`)."""
