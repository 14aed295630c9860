"""Per-module mutation scores from a finished ``mutmut run`` (see docs/mutation.md).

Reads mutmut's result files (``mutants/src/acrb/**/*.py.meta``), keeps the mutants of the
functions each module is scored on (:data:`SCOPES`), and writes
``benchmarks/results/mutation.json``: per module the mutants, killed, survived, timeouts,
the score (killed + timeout over all scored mutants; mutmut counts a timeout as a detection)
and every survivor with the reason it is left (:data:`JUSTIFIED`) or ``null`` when it has none
yet. Exits 1 when a module is under :data:`TARGET` counting justified survivors as
explained, so ``make mutation`` fails on an unexplained drop.

Run with the interpreter that has mutmut (its exit-code table is the one source of the
statuses): ``python benchmarks/mutation_report.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

from mutmut.stats import status_by_exit_code

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "mutation.json"
TARGET = 0.90

#: Module -> the mutant-name globs it is scored on (the part after the module name).
#: ``*``: every function of the module. Narrower scopes say why in a comment.
SCOPES: dict[str, list[str]] = {
    "acrb.analysis.tests.pvalues": ["*"],
    # The verdict of a hypothesis from its adjusted p, and the table that adjusts them.
    "acrb.analysis.tests.hypotheses": ["x__verdict__*", "x_evaluate_hypotheses__*"],
    "acrb.analysis.estimation.disparity": ["*"],
    # The permutation test of Δ and the cluster-bootstrap weights.
    "acrb.analysis.estimation.resampling": [
        "x__strata__*", "x__permuted_delta__*", "x_delta_permutation_p__*",
        "x__stratified_weights__*", "x_bootstrap_weights__*",
        # The row tests, the per-row Δ interval and corrected Δ, and the clustered rates.
        "x_group_test_p__*", "x__test_statistic__*", "x__between_groups__*", "x__gee_score__*",
        "x__no_gap__*", "x_resolve_resample__*", "x_delta_inversion__*", "x_invert_delta__*",
        "x__smallest__*", "x__range_at__*", "x__two_way_variance__*", "x__t_level__*",
        "x_rate_intervals__*", "x_mean_intervals__*", "x_stratum_adjusted__*",
    ],
    # The hash chain: sealing, hashing and verifying the audit log.
    "acrb.web.audit": ["x_canonical__*", "x_entry_hash__*", "x_seal__*", "x_verify__*",
                       "x__past_head__*", "xǁAuditTrailǁverify__*"],
    "acrb.web.sessions": ["*"],
    "acrb.web.security": ["*"],
    "acrb.judges.ensemble": ["*"],
    # The verdict helpers of a pixel measurement (the measurement itself is image code whose
    # tests take about a minute; it is out of this run).
    "acrb.detect.pixels": ["xǁPixelMeasuresǁlightened__*", "xǁPixelMeasuresǁerased__*"],
    # The verdict rule of the evaluate stage.
    "acrb.stages.evaluate": ["x_judge__*", "x__evidence__*", "x__near__*"],
    # The raters' agreement the review reports: Fleiss' kappa and Krippendorff's alpha, their
    # item bootstrap (items, not output units, are resampled), the weighted kappa of the
    # judge against people.
    "acrb.analysis.agreement.raters": [
        "x_unit_counts__*", "x_fleiss_kappa_unequal__*", "x__fleiss__*", "x__alpha__*",
        "x__item_bootstrap_weights__*", "x_replicate_fleiss__*", "x_replicate_alpha__*",
        "x_rater_agreement__*", "x__arm_agreement__*", "x__weighted_kappa__*",
        "x__agreement_row__*",
    ],
    # The judges' score tables: which group differences are significant (Holm), the judges'
    # agreement with each other, their means.
    "acrb.analysis.agreement.judging": ["x_score_tests__*", "x__posthoc_summary__*",
                                        "x__agreement__*", "x_judge_agreement__*",
                                        "x_judge_means__*"],
    # Prediction-powered correction of the judge's rates by the people's ratings.
    "acrb.analysis.agreement.corrected": ["*"],
    # Raters' and curators' accounts: tokens, login, sessions, logout.
    "acrb.web.accounts": ["*"],
    # Masking of API keys in logs, tables, replies and tracebacks.
    "acrb.redaction": ["*"],
    # The check that a feature prompt names no demographic label.
    "acrb.features.labels": ["*"],
    # Reading an older record: the migration chain. The per-version steps are a module-level
    # table of lambdas, which mutmut does not mutate: tests/test_record_migrations.py and
    # tests/test_survivors_data.py check them (a version 3 generation, every field).
    "acrb.records": ["x_migrate__*", "x__migrated_table__*", "x_upgrade_records__*"],
    # The paper's tables: which number lands in which cell under which header, from the
    # builders that pick and name each table's quantities to the text cells people read.
    # Out of scope: the pooled estimate's block (the resampling code it calls is scored
    # above), the LaTeX and the report's reading of the written CSVs (tests/test_paper_tables.py
    # on a whole project).
    "acrb.analysis.outputs.paper_tables": [
        "x__bound_text__*", "x_definition__*", "x_race_change_outcomes__*",
        "x_with_score_outcomes__*", "x_scored__*", "x_table1_axes__*", "x_judge_means__*",
        "x_race_rates__*", "x_summary_columns__*", "x_summary_measures__*",
        "x_model_summary__*", "x_race_gap__*", "x_feature_mitigation__*",
        "x_feature_scores__*", "x_white_vs_nonwhite__*", "x_winobias__*",
        "x_judge_human_means__*", "x_means_reproduce__*", "x_judge_human__*",
        "x_fmt_pct__*", "x_fmt_num__*", "x_fmt_p__*", "x__text__*", "x__level__*",
        "x__label__*", "x__definitions__*", "x__missing__*", "x__display_*",
    ],
}

#: Surviving mutant -> why it is left alive (equivalent: no input tells it apart; harmless).
JUSTIFIED: dict[str, str] = {
    "acrb.web.audit.x_canonical__mutmut_4":
        "equivalent: ensure_ascii=None is falsy, the same as ensure_ascii=False",
    "acrb.analysis.tests.pvalues.x_holm__mutmut_3":
        "equivalent: both callers pass float arrays (adjust casts to float first, Dunn's "
        "pairs are a float matrix), so dropping holm's own cast changes nothing",
    "acrb.analysis.tests.pvalues.x_holm__mutmut_5":
        "equivalent: as mutmut_3 (dtype=None for a float array is the same array)",
    "acrb.analysis.tests.pvalues.x_holm__mutmut_21":
        "equivalent: capping values >= 1 at 1 instead of values > 1 sets 1 to 1",
    "acrb.web.audit.x_verify__mutmut_90":
        "equivalent: Python's codec names are case-insensitive ('UTF-8' is 'utf-8')",
    "acrb.analysis.tests.hypotheses.x__verdict__mutmut_27":
        "equivalent: a missing margin defaults to None instead of NaN; _pp prints both as '—'",
    "acrb.analysis.tests.hypotheses.x__verdict__mutmut_29":
        "equivalent: row.get('margin') without a default is None; _pp prints it as '—' like NaN",
    "acrb.analysis.tests.hypotheses.x__verdict__mutmut_34":
        "equivalent: float('NAN') is float('nan')",
    "acrb.analysis.tests.hypotheses.x_evaluate_hypotheses__mutmut_93":
        "equivalent: 'holm' is adjust's default method",
    "acrb.analysis.tests.hypotheses.x_evaluate_hypotheses__mutmut_94":
        "equivalent: every row builder sets p_value to a float (NaN when untested), so the "
        "column is float64 and to_numpy() without a dtype returns the same array",
    "acrb.analysis.tests.hypotheses.x_evaluate_hypotheses__mutmut_109":
        "equivalent: pandas reads to_dict's orient case-insensitively ('RECORDS' is 'records')",
    "acrb.web.audit.xǁAuditTrailǁverify__mutmut_29":
        "equivalent: sqlite3.Row looks columns up case-insensitively ('LINES' is 'lines')",
    "acrb.web.audit.xǁAuditTrailǁverify__mutmut_48":
        "equivalent: sqlite3.Row looks columns up case-insensitively ('FILE' is 'file')",
    "acrb.web.audit.xǁAuditTrailǁverify__mutmut_51":
        "equivalent: sqlite3.Row looks columns up case-insensitively ('AFTER_SEQ' is 'after_seq')",
    "acrb.web.audit.xǁAuditTrailǁverify__mutmut_57":
        "equivalent: sqlite3.Row looks columns up case-insensitively ('FILE' is 'file')",
    "acrb.web.audit.xǁAuditTrailǁverify__mutmut_41":
        "equivalent: drops the positional line=None, which is Verification's default",
    "acrb.web.security.x_same_origin__mutmut_15":
        "equivalent: both sides of the comparison go through the same key(), so upper-casing "
        "the host name on both compares the same pairs",
    "acrb.web.security.xǁLoginThrottleǁ_recent__mutmut_8":
        "equivalent: a failure exactly one window old that '<' keeps can only be "
        "failures[-max_failures] when it alone fills the budget, and then the wait is "
        "max(old + window - now, 0) = 0, as without it",
    "acrb.web.security.xǁLoginThrottleǁfailed__mutmut_5":
        "equivalent: popitem(last=None) is popitem(last=False) (None is falsy)",
    "acrb.web.security.xǁBodyLimitǁ__call____mutmut_44":
        "equivalent: started = None is falsy like False until the response starts",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_73":
        "equivalent: urlsplit lower-cases the scheme, so 'HTTP' and 'http' give the same key",
    "acrb.web.security.xǁSecurityHeadersǁ__call____mutmut_27":
        "equivalent: Python's codec names are case-insensitive ('LATIN-1' is 'latin-1')",
    "acrb.web.security.xǁBodyLimitǁ__call____mutmut_16":
        "equivalent: Starlette's Headers.get is case-insensitive",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_21":
        "equivalent: Starlette's Headers.get is case-insensitive",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_29":
        "equivalent: Starlette's Headers.get is case-insensitive",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_79":
        "equivalent: Starlette's Headers.get is case-insensitive",
    "acrb.web.security.xǁBodyLimitǁ__call____mutmut_20":
        "equivalent: a PlainTextResponse never calls receive, so passing None instead is unseen",
    "acrb.web.security.xǁBodyLimitǁ__call____mutmut_36":
        "equivalent: a PlainTextResponse never calls receive, so passing None instead is unseen",
    "acrb.web.security.xǁBodyLimitǁ__call____mutmut_70":
        "equivalent: a PlainTextResponse never calls receive, so passing None instead is unseen",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_38":
        "equivalent: a PlainTextResponse never calls receive, so passing None instead is unseen",
    "acrb.web.security.xǁCrossSiteGuardǁ__call____mutmut_83":
        "equivalent: a PlainTextResponse never calls receive, so passing None instead is unseen",
    "acrb.web.sessions.x__set_cookie__mutmut_9":
        "equivalent: drops path='/', which is Starlette's default for set_cookie",
    "acrb.web.sessions.xǁSessionCookiesǁclear_login_csrf__mutmut_6":
        "equivalent: drops path='/', which is Starlette's default for delete_cookie",
    "acrb.web.sessions.xǁSessionCookiesǁclear_session__mutmut_6":
        "equivalent: drops path='/', which is Starlette's default for delete_cookie",
    "acrb.web.sessions.xǁSessionTableǁ__init____mutmut_12":
        "equivalent: SQL keywords in lower case (SQLite keywords are case-insensitive)",
    "acrb.web.sessions.xǁSessionTableǁ__init____mutmut_13":
        "equivalent: column name in upper case (SQLite identifiers are case-insensitive)",
    "acrb.web.sessions.xǁSessionTableǁopen__mutmut_12":
        "equivalent: SQL keyword in lower case (SQLite keywords are case-insensitive)",
    "acrb.judges.ensemble.x_combine_axis__mutmut_47":
        "equivalent in practice: <= vs < on a bound padded by 1e-12 for float noise; only a "
        "difference of exactly step + 1e-12 tells them apart",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_21":
        "equivalent: float('NAN') is float('nan')",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_24":
        "equivalent: float('NAN') is float('nan')",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_30":
        "equivalent: g(g-1) is even, so /2 gives the number //2 gives (exact as a float below "
        "2**53 pairs, far past what triu_indices can allocate); alpha / m is the same",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_46":
        "equivalent: method=None is statsmodels' default for compare='diff', which is 'newcomb'",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_53":
        "equivalent: the default method of confint_proportions_2indep for compare='diff' is "
        "'newcomb'",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_54":
        "equivalent: compare='diff' is confint_proportions_2indep's default",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_57":
        "equivalent: confint_proportions_2indep lower-cases the method name",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_65":
        "equivalent: k and n are float64, so statsmodels returns float64 bounds; and max, "
        "negation and float() are exact in any float dtype",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_67":
        "equivalent: k and n are float64, so statsmodels returns float64 bounds; and max, "
        "negation and float() are exact in any float dtype",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_70":
        "equivalent: k and n are float64, so statsmodels returns float64 bounds; and max, "
        "negation and float() are exact in any float dtype",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_72":
        "equivalent: k and n are float64, so statsmodels returns float64 bounds; and max, "
        "negation and float() are exact in any float dtype",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_96":
        "equivalent: lower = max(0.0, ...) is already >= 0 (Python's max keeps 0.0 over NaN)",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_97":
        "equivalent: lower never exceeds 1: Newcombe's L_ij <= max(l_i, p_i) - p_j <= 1 for "
        "0 <= k <= n (Wilson l_i clipped to [0, 1]); max 0.984 over every table with n <= 40, "
        "1.0 at n ~ 1e15; none above 1 in fuzzed tables with k < 0 or k > n",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_102":
        "equivalent: lower never exceeds 1: Newcombe's L_ij <= max(l_i, p_i) - p_j <= 1 for "
        "0 <= k <= n (Wilson l_i clipped to [0, 1]); max 0.984 over every table with n <= 40, "
        "1.0 at n ~ 1e15; none above 1 in fuzzed tables with k < 0 or k > n",
    "acrb.analysis.estimation.disparity.x_delta_interval__mutmut_105":
        "equivalent: upper = max_ij max(U_ij, -L_ij) >= 0 because U_ij - L_ij is a sum of two "
        "square roots (NaN stays NaN either way)",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_10":
        "harmless: the confidence of group_rates only sets the rates' Wilson intervals, which "
        "disparities never reads (it takes value, n, k, rate)",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_14":
        "equivalent: pandas groupby only tests sort for truth, so sort=None is sort=False",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_91":
        "equivalent: float('NAN') is float('nan')",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_124":
        "equivalent: 'holm' is adjust's default method",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_125":
        "equivalent: the p_value column is float64 (homogeneity_test returns floats) and adjust "
        "casts to float itself",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_134":
        "equivalent: p_adjusted is float64 and its comparison with alpha is a bool Series (NaN < "
        "alpha is False), so fillna has nothing to fill",
    "acrb.analysis.estimation.disparity.x_disparities__mutmut_138":
        "equivalent: p_adjusted is float64 and its comparison with alpha is a bool Series (NaN < "
        "alpha is False), so fillna has nothing to fill",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_7":
        "equivalent: float zeros as the codes of a free permutation; they are only sort keys "
        "and give codes.max() + 1 = 1 as int64 zeros do",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_9":
        "equivalent: np.zeros without a dtype is float zeros; as mutant 7",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_66":
        "equivalent: float zeros as the codes of a free permutation (automatic fallback); as "
        "mutant 7",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_68":
        "equivalent: np.zeros without a dtype is float zeros; as mutant 66",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_13":
        "harmless: float64 stratum codes are the same integers below 2**53; a block's "
        "covariates are the one or two other dimensions (or the base prompt), so codes stay "
        "below S**2, exact for fewer than 9e7 sources",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_15":
        "harmless: np.zeros without a dtype is float64; as mutant 13",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_18":
        "equivalent: sort=None is falsy, so levels are numbered in order of appearance: the "
        "same strata numbered otherwise, and renumbering leaves every permutation as it is "
        "(test_the_p_value_does_not_depend_on_how_the_strata_are_spelled), up to a float tie of "
        "two stratum + U keys (odds ~2**-50 a pair)",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_20":
        "equivalent: factorize's default sort=False; the same strata numbered otherwise, as "
        "mutant 18",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_26":
        "equivalent: sort=False; the same strata numbered otherwise, as mutant 18",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_28":
        "equivalent: combined * K - level is the mixed-radix code negated: the same strata "
        "numbered in reverse, as mutant 18",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_23":
        "equivalent: a Block's covariates are object arrays, which np.asarray leaves as they "
        "are; a typed array gives other strings for the same values, so the same strata "
        "(renumbering as mutant 18)",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_25":
        "equivalent: np.asarray without dtype=object; as mutant 23",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_34":
        "harmless: max(K, 2) multiplies by 2 for a one-valued covariate, which keeps the codes "
        "distinct and in order (the same strata) unless the multipliers' product passes 2**63 "
        "(over 60 covariates; ACRB's blocks have at most two)",
    "acrb.analysis.estimation.resampling.x__strata__mutmut_53":
        "equivalent: every stratum code occurs in pairs (np.unique's inverse numbers 0..U-1), "
        "so the bincount already has len(sizes) entries",
    "acrb.analysis.estimation.resampling.x__stratified_weights__mutmut_15":
        "equivalent: numpy's sort kind names are case-insensitive ('STABLE' is 'stable')",
    "acrb.analysis.estimation.resampling.x__stratified_weights__mutmut_23":
        "equivalent: side='left' is searchsorted's default",
    "acrb.analysis.estimation.resampling.x__stratified_weights__mutmut_34":
        "equivalent: the clamp never acts: Generator.random() is at most 1 - 2**-53 and fl((1 - "
        "2**-53) * m) < m for every integer m <= 2**53, so floor(U * m) <= m - 1 already",
    "acrb.analysis.estimation.resampling.x__stratified_weights__mutmut_37":
        "equivalent: drops out=draws, discarding a clamp that never acts (mutant 34)",
    "acrb.analysis.estimation.resampling.x__stratified_weights__mutmut_38":
        "equivalent: clamps at m instead of m - 1; no draw passes m - 1 anyway (mutant 34)",
    # The raters' and judges' agreement modules (tests/test_mutants_agreement.py kills the rest).
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_4":
        "equivalent: the pairs are filtered to both-present, so a Float64 or float64 consensus "
        "column gives float64 with or without dtype=float",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_6":
        "equivalent: as mutant 4, for the judge's column",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_11":
        "equivalent: renames the NaN default of 'weighted_kappa'; judge_human_agreement builds its "
        "frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_12":
        "equivalent: renames the NaN default of 'weighted_kappa'; judge_human_agreement builds its "
        "frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_13":
        "equivalent: renames the NaN default of 'spearman'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_14":
        "equivalent: renames the NaN default of 'spearman'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_15":
        "equivalent: renames the NaN default of 'spearman_p'; judge_human_agreement builds its "
        "frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_16":
        "equivalent: renames the NaN default of 'spearman_p'; judge_human_agreement builds its "
        "frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_17":
        "equivalent: renames the NaN default of 'mean_difference'; judge_human_agreement builds "
        "its frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_18":
        "equivalent: renames the NaN default of 'mean_difference'; judge_human_agreement builds "
        "its frame with explicit columns, so a key missing from a row reads NaN (float64), as the "
        "default does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_19":
        "equivalent: renames the NaN default of 'ci_low'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_20":
        "equivalent: renames the NaN default of 'ci_low'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_21":
        "equivalent: renames the NaN default of 'ci_high'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_22":
        "equivalent: renames the NaN default of 'ci_high'; judge_human_agreement builds its frame "
        "with explicit columns, so a key missing from a row reads NaN (float64), as the default "
        "does",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_34":
        "equivalent: rounded judge scores as floats 1.0-5.0 match cohen_kappa_score's integer "
        "labels 1-5 as the ints do (same confusion matrix)",
    "acrb.analysis.agreement.raters.x__agreement_row__mutmut_43":
        "equivalent: as mutant 34, for the human consensus (already whole numbers)",
    "acrb.analysis.agreement.raters.x__alpha__mutmut_12":
        "equivalent: with value_counts, krippendorff's default domain is the columns' positions "
        "0-4, a shift of 1-5 that leaves interval differences and ordinal ranks as they are "
        "(checked on tables with unused values)",
    "acrb.analysis.agreement.raters.x__alpha__mutmut_15":
        "equivalent: drops value_domain; as mutant 12",
    "acrb.analysis.agreement.raters.x__arm_agreement__mutmut_20":
        "equivalent: with no unit, factorize gives an empty code array instead of None, and the "
        "bootstrap still never runs (n_items is 0 < 2)",
    "acrb.analysis.agreement.raters.x__arm_agreement__mutmut_27":
        "equivalent: _cells of no unit is the single all/all cell with an empty mask, the fallback "
        "itself (no model, no group present)",
    "acrb.analysis.agreement.raters.x__arm_agreement__mutmut_53":
        "equivalent: nunique of an empty mask's item ids is 0, the value the guard gives",
    "acrb.analysis.agreement.raters.x__fleiss__mutmut_7":
        "equivalent: the condition is then always true, so equal counts also go to "
        "fleiss_kappa_unequal, which reduces to Fleiss' formula (equal to statsmodels to 1e-12, "
        "test_fleiss_unequal_counts_by_hand) and is NaN where statsmodels' route is",
    "acrb.analysis.agreement.raters.x__fleiss__mutmut_19":
        "equivalent in practice: for category shares p, sum p^3 and sum p^2 are both 1 exactly "
        "when one category holds every rating; within np.isclose's 1e-5 they part only when fewer "
        "than about 1 rating in 100,000 is off that category",
    "acrb.analysis.agreement.raters.x__fleiss__mutmut_25":
        "equivalent: method='fleiss' is statsmodels' default",
    "acrb.analysis.agreement.raters.x__item_bootstrap_weights__mutmut_9":
        "equivalent: Generator.integers(n, size) draws from [0, n), the same stream as integers(0, "
        "n, size) (checked draw for draw)",
    "acrb.analysis.agreement.raters.x_fleiss_kappa_unequal__mutmut_3":
        "equivalent: counts are integers; the products and sums stay exact and the divisions give "
        "the same floats as from a float copy",
    "acrb.analysis.agreement.raters.x_fleiss_kappa_unequal__mutmut_5":
        "equivalent: counts are integers; the products and sums stay exact and the divisions give "
        "the same floats as from a float copy",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_37":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_40":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_41":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_44":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_47":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_rater_agreement__mutmut_49":
        "equivalent: zip's strict only checks lengths, and spawn(len(x)) always gives len(x) seeds",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_3":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_5":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_26":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_28":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_41":
        "equivalent: numpy's reshape reads any negative size as 'infer' (-2 works as -1)",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_44":
        "equivalent: the coincidence matrix is symmetric, so its row and column totals are the "
        "same",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_53":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_55":
        "equivalent: counts, weights and the scale values are integers; products and sums stay "
        "exact and the divisions give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_104":
        "equivalent: changes only the diagonal of the expected coincidences, which the metric's "
        "zero distance of a value to itself multiplies away",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_111":
        "equivalent: the used-values guard is redundant: a replicate with one value has zero "
        "observed and expected disagreement, 1 - 0/0 is NaN already (and an empty one 0/0 too)",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_112":
        "equivalent: as mutant 111 (the guard always passes)",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_116":
        "equivalent: no division here has a zero divisor with a nonzero numerator (pairable counts "
        "minus 1 are >= 1; a zero expected disagreement comes with a zero observed one), so "
        "numpy's divide warning never fires; the 0/0 'invalid' case stays silenced",
    "acrb.analysis.agreement.raters.x_replicate_alpha__mutmut_118":
        "equivalent: no division here has a zero divisor with a nonzero numerator (pairable counts "
        "minus 1 are >= 1; a zero expected disagreement comes with a zero observed one), so "
        "numpy's divide warning never fires; the 0/0 'invalid' case stays silenced",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_3":
        "equivalent: integer counts and weights; the matrix products are exact and the divisions "
        "give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_5":
        "equivalent: integer counts and weights; the matrix products are exact and the divisions "
        "give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_14":
        "equivalent: integer counts and weights; the matrix products are exact and the divisions "
        "give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_16":
        "equivalent: integer counts and weights; the matrix products are exact and the divisions "
        "give the same floats",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_21":
        "equivalent: every division by zero here is 0/0 (no unit drawn; one category, where "
        "observed and chance agreement are both exactly 1), numpy's 'invalid' case, which stays "
        "silenced; 'divide' never fires",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_23":
        "equivalent: every division by zero here is 0/0 (no unit drawn; one category, where "
        "observed and chance agreement are both exactly 1), numpy's 'invalid' case, which stays "
        "silenced; 'divide' never fires",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_58":
        "equivalent: a replicate with no mass has NaN shares, so isclose is False and the kappa, "
        "0/0 = NaN, is returned either way",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_59":
        "equivalent: as mutant 58 (mass >= 0 is always true)",
    "acrb.analysis.agreement.raters.x_replicate_fleiss__mutmut_66":
        "equivalent: chance agreement 1 means every drawn rating in one category; integer weights "
        "make the shares and the observed agreement exactly 1, so the kappa is 0/0 = NaN without "
        "the guard",
    "acrb.analysis.agreement.raters.x_unit_counts__mutmut_28":
        "equivalent: Int64 scores give crosstab columns 1-5 that reindex(columns=[1, ..., 5]) "
        "matches as it matches int columns",
    "acrb.analysis.agreement.raters.x_unit_counts__mutmut_44":
        "equivalent: index=None is falsy, as index=False",
    "acrb.analysis.agreement.raters.x_unit_counts__mutmut_55":
        "equivalent: a crosstab of counts is int64 already",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_13":
        "harmless: silences every warning instead of RuntimeWarning only, around the kappa call; "
        "the kappa is the same",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_15":
        "harmless: silences every warning instead of RuntimeWarning only, around the kappa call; "
        "the kappa is the same",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_28":
        "equivalent: whole-number scores as floats match the integer labels 1-5 as ints do; a half "
        "score is refused by krippendorff's 1-5 value domain right after either way",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_29":
        "equivalent: whole-number scores as floats match the integer labels 1-5 as ints do; a half "
        "score is refused by krippendorff's 1-5 value domain right after either way",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_37":
        "equivalent: krippendorff infers the domain from the values used; the ordinal distance of "
        "two values sums the counts of the values between them, where an unused value adds 0, so "
        "the 1-5 domain gives the same alpha for scores on the scale",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_40":
        "equivalent: drops value_domain; as mutant 37",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_41":
        "equivalent: a and b are float arrays already (judge_agreement passes to_numpy(float))",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_55":
        "equivalent: 'interval' is krippendorff.alpha's default level_of_measurement",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_56":
        "equivalent: a and b are float arrays already (judge_agreement passes to_numpy(float))",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_63":
        "equivalent: unreachable: with two values used on the 1-5 scale the quadratic kappa's "
        "expected disagreement is positive, so it is finite; a NaN needs a half score, which "
        "krippendorff's 1-5 value domain refuses before this line",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_64":
        "equivalent: unreachable: with two values used on the 1-5 scale the quadratic kappa's "
        "expected disagreement is positive, so it is finite; a NaN needs a half score, which "
        "krippendorff's 1-5 value domain refuses before this line",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_65":
        "equivalent: unreachable: with two values used on the 1-5 scale the quadratic kappa's "
        "expected disagreement is positive, so it is finite; a NaN needs a half score, which "
        "krippendorff's 1-5 value domain refuses before this line",
    "acrb.analysis.agreement.judging.x__agreement__mutmut_67":
        "equivalent: there is at most one note (the fraction-axis note needs a non-ordinal axis, "
        "the undefined-kappa one an ordinal axis), and joining one string ignores the separator",
    "acrb.analysis.agreement.judging.x_judge_agreement__mutmut_36":
        "equivalent: the pair's columns are request_id and the score axes (_scored), the design's "
        "request_id and the source dimensions, so merging on the common columns is merging on "
        "request_id",
    "acrb.analysis.agreement.judging.x_judge_agreement__mutmut_39":
        "equivalent: the pair's columns are request_id and the score axes (_scored), the design's "
        "request_id and the source dimensions, so merging on the common columns is merging on "
        "request_id",
    "acrb.analysis.agreement.judging.x_judge_agreement__mutmut_40":
        "equivalent: how='inner' is DataFrame.merge's default",
    "acrb.analysis.agreement.judging.x_judge_agreement__mutmut_79":
        "equivalent: pd.to_numeric(errors='coerce') gives a float64 (or int64) Series; either is "
        "the same numbers for _agreement, which casts to int and float itself",
    "acrb.analysis.agreement.judging.x_judge_agreement__mutmut_80":
        "equivalent: pd.to_numeric(errors='coerce') gives a float64 (or int64) Series; either is "
        "the same numbers for _agreement, which casts to int and float itself",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_28":
        "equivalent: an axis the frame lacks becomes an all-missing Series of None instead of NaN; "
        "notna() is False everywhere either way",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_30":
        "equivalent: an axis the frame lacks becomes an all-missing Series of None instead of NaN; "
        "notna() is False everywhere either way",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_39":
        "equivalent: sort=True is DataFrame.groupby's default",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_73":
        "equivalent: float zeros as the one stratum of sources; bootstrap_weights draws the same "
        "weights from them (checked on a seeded generator)",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_75":
        "equivalent: float zeros as the one stratum of sources; bootstrap_weights draws the same "
        "weights from them (checked on a seeded generator)",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_77":
        "equivalent: with resample='sources' the prompt strata only size the prompt weights, which "
        "judge_means discards (the source weights are the same, checked)",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_79":
        "equivalent: with resample='sources' the prompt strata only size the prompt weights, which "
        "judge_means discards (the source weights are the same, checked)",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_80":
        "equivalent: with resample='sources' the prompt strata only size the prompt weights, which "
        "judge_means discards (the source weights are the same, checked)",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_84":
        "equivalent: the per-source sums (float) and counts (int) times integer weights are the "
        "same numbers without the float cast",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_88":
        "equivalent: the per-source sums (float) and counts (int) times integer weights are the "
        "same numbers without the float cast",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_93":
        "equivalent: every source kept has at least one score and a replicate's weights sum to the "
        "number of sources (>= 2), so its weighted count is >= 2: > 0, >= 0 and > 1 keep every "
        "replicate",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_94":
        "equivalent: every source kept has at least one score and a replicate's weights sum to the "
        "number of sources (>= 2), so its weighted count is >= 2: > 0, >= 0 and > 1 keep every "
        "replicate",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_95":
        "equivalent: every source kept has at least one score and a replicate's weights sum to the "
        "number of sources (>= 2), so its weighted count is >= 2: > 0, >= 0 and > 1 keep every "
        "replicate",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_96":
        "equivalent: every source kept has at least one score and a replicate's weights sum to the "
        "number of sources (>= 2), so its weighted count is >= 2: > 0, >= 0 and > 1 keep every "
        "replicate",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_123":
        "equivalent: every row is built with the keys of MEAN_COLUMNS in order, and there is one "
        "row per score axis, never none",
    "acrb.analysis.agreement.judging.x_judge_means__mutmut_125":
        "equivalent: every row is built with the keys of MEAN_COLUMNS in order, and there is one "
        "row per score axis, never none",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_89":
        "harmless: the separator between a failed score test's reason and an odds-ratio note, "
        "which meet only when the score test itself fails on separated data (it did not on any "
        "separated design tried); no number changes",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_98":
        "equivalent: the frame then starts with an empty p_adjusted or significant column, which "
        "the next lines overwrite before the columns are put in order",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_99":
        "equivalent: the frame then starts with an empty p_adjusted or significant column, which "
        "the next lines overwrite before the columns are put in order",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_100":
        "equivalent: the frame then starts with an empty p_adjusted or significant column, which "
        "the next lines overwrite before the columns are put in order",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_101":
        "equivalent: the frame then starts with an empty p_adjusted or significant column, which "
        "the next lines overwrite before the columns are put in order",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_106":
        "equivalent: 'holm' is adjust's default method",
    "acrb.analysis.agreement.judging.x_score_tests__mutmut_107":
        "equivalent: adjust casts to float itself (np.asarray(p, dtype=float))",
    "acrb.analysis.agreement.corrected.x__as_array__mutmut_7":
        "equivalent: numpy reads any negative size in reshape as the one to infer, so reshape(-2)"
        " is reshape(-1)",
    "acrb.analysis.agreement.corrected.x_power_tuned_lambda__mutmut_23":
        "equivalent: mean((Y + Ȳ)(Ŷ − mean Ŷ)) = mean(Y(Ŷ − mean Ŷ)) = Cov(Y, Ŷ): centring one "
        "factor is enough, the other's mean term multiplies a mean of 0 (they differ by float "
        "rounding only)",
    "acrb.analysis.agreement.corrected.x_power_tuned_lambda__mutmut_24":
        "equivalent: mean((Y − Ȳ)(Ŷ + mean Ŷ)) = Cov(Y, Ŷ) + mean Ŷ · mean(Y − Ȳ) = Cov(Y, Ŷ), as"
        " mutant 23",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_55":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_65":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_66":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_85":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_87":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_88":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_90":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_92":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_93":
        "equivalent: ppi_py returns the estimate and the bounds of a 1-D mean as arrays of shape "
        "(1,) (it reshapes its inputs to (n, 1)); reshape(None), reshape(1) and reshape(-2) of a "
        "one-element vector are that vector",
    "acrb.analysis.agreement.corrected.x_ppi_rate__mutmut_134":
        "equivalent in practice: >= instead of > differs only when the Wilson floor equals the "
        "PPI standard error to the last bit, and then sets se to the value it has",
    "acrb.analysis.agreement.corrected.x_delta__mutmut_70":
        "equivalent: method=None is statsmodels' default for compare='diff', which is 'newcomb'",
    "acrb.analysis.agreement.corrected.x_delta__mutmut_77":
        "equivalent: drops method='newcomb', the default method of confint_proportions_2indep for"
        " compare='diff'",
    "acrb.analysis.agreement.corrected.x_delta__mutmut_78":
        "equivalent: compare='diff' is confint_proportions_2indep's default",
    "acrb.analysis.agreement.corrected.x_delta__mutmut_81":
        "equivalent: confint_proportions_2indep lower-cases the method name",
    "acrb.analysis.agreement.corrected.x_human_outcomes__mutmut_44":
        "equivalent: merge with on=None joins on the columns both frames share, and item_id is "
        "the only one (the consensus has item_id, output and the axis' columns; the sample "
        "item_id and the request key)",
    "acrb.analysis.agreement.corrected.x_human_outcomes__mutmut_47":
        "equivalent: drops on='item_id'; merge then joins on the shared columns, item_id alone "
        "(mutant 44)",
    "acrb.analysis.agreement.corrected.x_human_outcomes__mutmut_48":
        "equivalent: how='inner' is DataFrame.merge's default",
    "acrb.analysis.agreement.corrected.x_human_outcomes__mutmut_62":
        "equivalent: a NaN consensus reaches OutcomeRule.applies as float('nan') instead of None,"
        " and applies returns None for both (score != score)",
    "acrb.analysis.agreement.corrected.x_labelled_frame__mutmut_20":
        "equivalent: the cast only feeds notna(); astype(None) gives float64 with NaN where the "
        "outcome is missing, the same mask as the nullable boolean",
    "acrb.analysis.agreement.corrected.x_labelled_frame__mutmut_24":
        "equivalent: notna() is a plain bool Series (never NA), so to_numpy() without a dtype is "
        "the same bool array",
    "acrb.analysis.agreement.corrected.x_labelled_frame__mutmut_43":
        "equivalent: merge with on=None joins on the shared columns, and request_id is the only "
        "one (the judged side has the source dimensions and judge, the human side human)",
    "acrb.analysis.agreement.corrected.x_labelled_frame__mutmut_46":
        "equivalent: drops on='request_id'; merge then joins on request_id alone (mutant 43)",
    "acrb.analysis.agreement.corrected.x__split__mutmut_2":
        "equivalent: notna() is a plain bool Series (never NA), so to_numpy() without a dtype is "
        "the same bool array",
    "acrb.analysis.agreement.corrected.x__split__mutmut_6":
        "equivalent: pandas' astype(None) of a bool or boolean column is astype(float64), the "
        "same as astype(float)",
    "acrb.analysis.agreement.corrected.x__split__mutmut_10":
        "equivalent: pandas' astype(None) of a bool or boolean column is astype(float64), the "
        "same as astype(float)",
    "acrb.analysis.agreement.corrected.x__split__mutmut_14":
        "equivalent: pandas' astype(None) of a bool or boolean column is astype(float64), the "
        "same as astype(float)",
    "acrb.analysis.agreement.corrected.x_corrected_rates__mutmut_30":
        "equivalent: the rows are _estimate_row's dicts, keyed in CORRECTED_RATE_COLUMNS order, "
        "and there are always rows (the pooled cell's three), so the frame has those columns in "
        "that order without columns=",
    "acrb.analysis.agreement.corrected.x_corrected_rates__mutmut_32":
        "equivalent: drops columns=; as mutant 30",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_19":
        "equivalent: note is read only by the join's `if x` filter, which leaves out None as it "
        "leaves out ''",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_40":
        "equivalent: the rows without a PPI pair are dicts keyed in CORRECTED_DELTA_COLUMNS "
        "order, one per estimator, so the frame has those columns in that order without columns=",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_42":
        "equivalent: drops columns=; as mutant 40",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_118":
        "equivalent: the selection note and a Δ note are never both there: without a named pair "
        "both groups have a finite PPI rate, so at least two labelled outputs each and finite "
        "judge and human rates, and delta notes only a group with no estimate",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_120":
        "equivalent: the rows are dicts keyed in CORRECTED_DELTA_COLUMNS order, one per "
        "estimator, so the frame has those columns in that order without columns=",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_122":
        "equivalent: drops columns=; as mutant 120",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_55":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_56":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_57":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_58":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_59":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_60":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_61":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.analysis.agreement.corrected.x_corrected_deltas__mutmut_62":
        "equivalent: a misspelled key in the rows without a PPI pair is dropped by columns=, "
        "which fills the column it should have set with NaN, the value it held",
    "acrb.redaction.x__redacting_excepthook__mutmut_12":
        "equivalent: traceback.format_exception ignores its first argument when the value and "
        "the traceback are given (Python 3.10+), so None for the exception type is the same",
}


def _explain(module: str, reason: str, *mutants: str) -> None:
    """Record the same reason for several survivors of ``module`` (mutant numbers)."""
    for number in mutants:
        JUSTIFIED[f"{module}.{number}"] = reason


_REDACTION = "acrb.redaction"
_explain(_REDACTION, "equivalent: a key's first character always starts its block 0, which the "
         "left-to-right search reaches at that position before any later block of the run, so "
         "a run never needs growing back to key offset 0", "x__grow__mutmut_7")
_explain(_REDACTION, "equivalent: the grown-run check only skips recomputing a run already "
         "grown; never skipping recomputes the same run", "x__spans__mutmut_31")
_explain(_REDACTION, "equivalent: looking up diagonal at + offset finds nothing grown yet (its "
         "runs start at or after at + offset, and positions are visited left to right; for "
         "offset 0 it is the right diagonal), so it never skips: the same run is recomputed",
         "x__spans__mutmut_35")
_explain(_REDACTION, "equivalent: a default of 1 or -2 is below at + 6 (at least 6) as -1 is, "
         "so a run not grown yet is never skipped", "x__spans__mutmut_36", "x__spans__mutmut_37")
_explain(_REDACTION, "equivalent: > skips one case fewer than >=, which recomputes the same run",
         "x__spans__mutmut_38")
_explain(_REDACTION, "no difference found: the grown end stored under the wrong diagonal "
         "(at + offset) can only make a later block of that diagonal be skipped where the key "
         "repeats with period 2 x offset, and another diagonal of the same period then masks "
         "the run; 6,000 random texts over periodic keys (periods 4 to 18), compared with the "
         "brute-force search of tests/test_mutants_redaction.py, showed no difference",
         "x__spans__mutmut_51")
_explain(_REDACTION, "equivalent: Python's codec names are case-insensitive ('UTF-8' is 'utf-8')",
         "x_contains_secret__mutmut_9", "x_redact_file__mutmut_9", "x_redact_file__mutmut_20")
_explain(_REDACTION, "equivalent: text[None:start] is text[:start]", "x_redact__mutmut_5")
_explain(_REDACTION, "harmless where the locale's encoding is UTF-8 (Python's UTF-8 mode, the "
         "C.UTF-8 and en_US.UTF-8 locales of CI and the containers): without encoding= the file "
         "is read and written in the locale's encoding; elsewhere a non-ASCII file could be "
         "rewritten in another encoding", "x_redact_file__mutmut_7", "x_redact_file__mutmut_16",
         "x_redact_file__mutmut_18")
_explain(_REDACTION, "equivalent: a missing value becomes 'XXXX', shorter than the 8 characters "
         "of a key, so it is refused as '' is", "x_register_secret__mutmut_3")
_explain(_REDACTION, "equivalent: a key of exactly 12 characters masked whole instead of by its "
         "pieces masks the same text, since its only run of 12 or more is the whole key",
         "x_register_secret__mutmut_15")
_explain(_REDACTION, "equivalent: blocks at every offset (step 1), or at offsets 1, 7, 13, ... "
         "(start 1), still put a whole block inside every run of 12 of the key, and every run "
         "found is grown to the same longest run: more or other blocks, the same masks",
         "x_register_secret__mutmut_25", "x_register_secret__mutmut_26")


_LABELS = "acrb.features.labels"
_explain(_LABELS, "equivalent: every pattern is compiled with re.IGNORECASE (tested), so the "
         "words' case does not matter, and words of one length cannot both match one text",
         "x__alternation__mutmut_6")
_explain(_LABELS, "equivalent: setdefault's default is None", "xǁLabelCheckǁfind__mutmut_22")
_explain(_LABELS, "equivalent: re.sub reads a replacement of None as '', and an allowed phrase "
         "is bounded by characters that are neither word characters nor hyphens, so removing it "
         "instead of blanking it leaves the words around it apart and finds the same labels "
         "in the same order", "xǁLabelCheckǁfind__mutmut_6")
_explain(_LABELS, "harmless: the allowed phrase is blanked with other non-label characters; "
         "the labels found differ only where a label's words stand on both sides of an allowed "
         "phrase ('a black French braid man'), which the rule itself reads as if the phrase "
         "were not there", "xǁLabelCheckǁfind__mutmut_8")
_explain(_LABELS, "equivalent: Python's codec names are case-insensitive ('UTF-8' is 'utf-8')",
         "xǁLabelCheckǁload__mutmut_5")
_explain(_LABELS, "harmless: without encoding= the file is read in the locale's encoding, which "
         "gives the same text for the shipped file (ASCII) and under any UTF-8, C or POSIX "
         "locale (PEP 538/540); only a non-ASCII labels file under another locale would differ",
         "xǁLabelCheckǁload__mutmut_3")

_TABLES = "acrb.analysis.outputs.paper_tables"
_explain(_TABLES, "equivalent: the tables get numeric score columns (float or nullable Float64, "
         "NaN where missing), which pd.to_numeric returns as float64 with or without "
         "errors='coerce', and astype(None) of a float64 Series is that Series",
         "x_with_score_outcomes__mutmut_5", "x_with_score_outcomes__mutmut_9",
         "x_scored__mutmut_7", "x_feature_scores__mutmut_17", "x_feature_scores__mutmut_21",
         "x_feature_scores__mutmut_25", "x_feature_scores__mutmut_29",
         "x_white_vs_nonwhite__mutmut_19", "x_white_vs_nonwhite__mutmut_23",
         "x_judge_human_means__mutmut_16", "x_judge_human_means__mutmut_20",
         "x_judge_human_means__mutmut_24", "x_judge_human_means__mutmut_28")
_explain(_TABLES, "equivalent: score >= bound is already a Series on the frame's index, and "
         "pd.Series(series) without index= keeps it (tested with a shuffled index)",
         "x_with_score_outcomes__mutmut_15", "x_with_score_outcomes__mutmut_17")
_explain(_TABLES, "equivalent: 'mean' is pooled_estimate's default kind",
         "x_judge_means__mutmut_30", "x_feature_scores__mutmut_86")
_explain(_TABLES, "equivalent: another fixed seed path for table 4 (no other table draws from "
         "Resampling.seed_for); the table stays reproducible and per model and outcome, which "
         "the tests check", "x_race_gap__mutmut_39")
_explain(_TABLES, "equivalent: zip's strict only raises on unequal lengths, and the zipped "
         "sequences are two columns of one frame or a block's groups and its rates",
         "x_race_gap__mutmut_85", "x_race_gap__mutmut_88", "x_race_gap__mutmut_90",
         "x_means_reproduce__mutmut_14", "x_means_reproduce__mutmut_19",
         "x_means_reproduce__mutmut_30", "x__definitions__mutmut_11",
         "x__definitions__mutmut_14", "x__definitions__mutmut_21",
         "x__display_feature_scores__mutmut_11", "x__display_feature_scores__mutmut_14",
         "x__display_feature_scores__mutmut_19")
_explain(_TABLES, "equivalent: a race a model lacks gets None instead of NaN in a column whose "
         "other values are rates (races no model has are not columns), which pandas stores as "
         "NaN", "x_race_gap__mutmut_97", "x_race_gap__mutmut_99")
_explain(_TABLES, "harmless: + 0.0 only turns a bound of -0.0 into 0.0 in the CSV; every shown "
         "cell goes through fmt_pct, which adds 0.0 itself (tested)",
         "x_race_gap__mutmut_106", "x_race_gap__mutmut_110")
_explain(_TABLES, "equivalent: groupby(sort=None) does not sort, as sort=False",
         "x_feature_mitigation__mutmut_23")
_explain(_TABLES, "equivalent: a misspelled key of a row dict is dropped by columns=, which "
         "fills the column it should have set with NaN, the value it held",
         "x_feature_mitigation__mutmut_64", "x_feature_mitigation__mutmut_65",
         "x_feature_mitigation__mutmut_66", "x_feature_mitigation__mutmut_67",
         "x_white_vs_nonwhite__mutmut_56", "x_white_vs_nonwhite__mutmut_57",
         "x_white_vs_nonwhite__mutmut_58", "x_white_vs_nonwhite__mutmut_59")
_explain(_TABLES, "equivalent: the mean of an empty array is NaN, the value the guard gives "
         "(numpy warns, nothing else changes)",
         "x_white_vs_nonwhite__mutmut_49", "x_white_vs_nonwhite__mutmut_54",
         "x_judge_human_means__mutmut_44", "x_judge_human_means__mutmut_49",
         "x__display_winobias__mutmut_53")
_explain(_TABLES, "equivalent: 'two-sided' is mannwhitneyu's default alternative, and scipy "
         "lower-cases the name", "x_white_vs_nonwhite__mutmut_72",
         "x_white_vs_nonwhite__mutmut_74")
_explain(_TABLES, "equivalent: a misspelled name keeps p_holm among the columns, so the frame "
         "starts with an empty p_holm, which the next line overwrites",
         "x_white_vs_nonwhite__mutmut_101", "x_white_vs_nonwhite__mutmut_102")
_explain(_TABLES, "equivalent: the sort keys are 0/1 flags; sorted as booleans they order the "
         "same", "x_winobias__mutmut_30", "x_judge_human__mutmut_92")
_explain(_TABLES, "equivalent: pandas applies sort_values' kind only to a single sort column; "
         "over two columns it always sorts stably (lexsort)",
         "x_winobias__mutmut_46", "x_winobias__mutmut_48", "x_winobias__mutmut_57",
         "x_winobias__mutmut_58", "x_judge_human__mutmut_88", "x_judge_human__mutmut_90",
         "x_judge_human__mutmut_100", "x_judge_human__mutmut_101")
_explain(_TABLES, "equivalent: reset_index without drop adds an 'index' column that the "
         "function's final column selection leaves out; the new index is the same",
         "x_winobias__mutmut_60", "x_winobias__mutmut_66", "x_judge_human__mutmut_201",
         "x_judge_human__mutmut_202")
_explain(_TABLES, "equivalent: the frames' judge_mean, human_mean, n and mean_difference columns "
         "are float and int already, so to_numpy() without a dtype is the same array",
         "x_means_reproduce__mutmut_3", "x_means_reproduce__mutmut_7",
         "x_means_reproduce__mutmut_26", "x_means_reproduce__mutmut_61",
         "x_means_reproduce__mutmut_69")
_explain(_TABLES, "equivalent: merge without on= joins on the shared columns, which are model "
         "and axis alone (the means are cut to model, axis and the two means; each alpha frame "
         "has model, axis and its own three columns)",
         "x_judge_human__mutmut_115", "x_judge_human__mutmut_118",
         "x_judge_human__mutmut_188", "x_judge_human__mutmut_191")
_explain(_TABLES, "equivalent: without a named rule the caption takes its else branch for None "
         "as for ''", "x__display_judge_human__mutmut_64")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT / "mutants" / "src").as_posix()
    return rel.removesuffix(".py.meta").replace("/", ".")


def _in_scope(name: str, module: str) -> bool:
    local = name[len(module) + 1:]
    return any(fnmatch.fnmatchcase(local, glob) for glob in SCOPES[module])


#: Where the in-process recheck of mutmut's timeouts is kept (beside mutmut's own results).
RECHECK = ROOT / "mutants" / "timeout-recheck.json"


def recheck_timeouts(names: list[str], limit: float | None = None, log=print,
                     workers: int = 1) -> dict[str, str]:
    """Run the tests of each mutant of ``names`` in a fresh process, not forked from mutmut's:
    mutmut forks its test process for every mutant, and a fork of a process with threads can
    hang on a lock the threads held (the web and end-to-end tests; likely pyarrow's threads),
    which mutmut then counts as a timeout and so as a kill. Here the mutant is switched on as
    mutmut does (``MUTANT_UNDER_TEST``, the mutated tree of ``mutants/src`` first on the path)
    and the tests mutmut recorded as calling the mutated function run once: ``"killed"`` when
    one fails, ``"survived"`` when they all pass, ``"timeout"`` when they hang here too: after
    ``limit`` seconds, by default 30 s plus ten times the tests' unmutated duration (mutmut's
    own measure). ``workers`` processes at a time. Used for mutmut's timeouts and, with
    ``--in-process``, for the mutants mutmut has not run. Results are cached in
    :data:`RECHECK` by mutant name."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    cache: dict[str, str] = json.loads(RECHECK.read_text()) if RECHECK.exists() else {}
    stats = json.loads((ROOT / "mutants" / "mutmut-stats.json").read_text())
    tests_by_function: dict[str, list[str]] = stats["tests_by_mangled_function_name"]
    durations: dict[str, float] = stats.get("duration_by_test", {})
    todo = [name for name in names if name not in cache]
    lock = threading.Lock()

    def one(name: str) -> None:
        tests = tests_by_function.get(name.rsplit("__mutmut_", 1)[0], [])
        wait = limit if limit is not None else 30 + 10 * sum(durations.get(t, 0.0) for t in tests)
        verdict = _rerun(name, tests, wait)
        with lock:
            cache[name] = verdict
            log(f"[{len(cache)}] {name}: {verdict}")
            RECHECK.write_text(json.dumps(cache, indent=1, ensure_ascii=False) + "\n")

    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        list(pool.map(one, todo))
    return {name: cache[name] for name in names}


def _rerun(name: str, tests: list[str], limit: float) -> str:
    """One mutant's tests in a fresh process with the mutant switched on (see
    :func:`recheck_timeouts`)."""
    import os

    if not tests:
        return "no tests"
    env = {**os.environ, "MUTANT_UNDER_TEST": name, "PYTHONPATH": str(ROOT / "mutants" / "src")}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p",
               "no:cacheprovider", "-n", "0", *sorted(tests)]
    try:
        done = subprocess.run(command, cwd=ROOT / "mutants", env=env, capture_output=True,
                              timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if done.returncode == 0 else "killed"


def collect() -> dict[str, dict[str, object]]:
    recheck: dict[str, str] = json.loads(RECHECK.read_text()) if RECHECK.exists() else {}
    modules: dict[str, dict[str, object]] = {}
    for meta in sorted((ROOT / "mutants" / "src").rglob("*.py.meta")):
        module = _module(meta)
        if module not in SCOPES:
            continue
        exit_codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        statuses = {name: status_by_exit_code[code] for name, code in exit_codes.items()
                    if _in_scope(name, module)}
        # A timeout rechecked in process (--recheck-timeouts), or a mutant mutmut has not run
        # that was run in process (--in-process), takes that run's verdict.
        rechecked = sorted(n for n, status in statuses.items()
                           if status == "timeout" and n in recheck)
        in_process = sorted(n for n, status in statuses.items()
                            if status == "not checked" and n in recheck)
        for name in (*rechecked, *in_process):
            statuses[name] = recheck[name]
        # Mutants not run yet (an interrupted or narrowed run) are reported, never scored.
        not_checked = sorted(n for n, status in statuses.items() if status == "not checked")
        for name in not_checked:
            del statuses[name]
        counts: dict[str, int] = {}
        for status in statuses.values():
            counts[status] = counts.get(status, 0) + 1
        total = len(statuses)
        detected = counts.get("killed", 0) + counts.get("timeout", 0)
        survivors = sorted(name for name, status in statuses.items()
                           if status not in ("killed", "timeout"))
        justified = sum(1 for name in survivors if name in JUSTIFIED)
        modules[module] = {
            "scope": SCOPES[module],
            "mutants": total,
            "killed": counts.get("killed", 0),
            "timeout": counts.get("timeout", 0),
            "survived": counts.get("survived", 0),
            "not_checked": len(not_checked),
            "timeouts_rechecked": len(rechecked),
            "run_in_process": len(in_process),
            "other": {k: v for k, v in counts.items()
                      if k not in ("killed", "timeout", "survived")},
            "score": round(detected / total, 4) if total else None,
            "score_with_justified": round((detected + justified) / total, 4) if total else None,
            "survivors": [{"mutant": name, "status": statuses[name],
                           "reason": JUSTIFIED.get(name)} for name in survivors],
        }
    return modules


def _timeouts(statuses: tuple[str, ...] = ("timeout",)) -> list[str]:
    """The scoped mutants mutmut reports with one of ``statuses`` (before any recheck)."""
    names = []
    for meta in sorted((ROOT / "mutants" / "src").rglob("*.py.meta")):
        module = _module(meta)
        if module not in SCOPES:
            continue
        exit_codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        names += [name for name, code in exit_codes.items()
                  if _in_scope(name, module) and status_by_exit_code[code] in statuses]
    return sorted(names)


def markdown_table(modules: dict[str, dict[str, object]]) -> str:
    """The per-module score table of docs/mutation.md."""
    lines = ["| module | mutants | killed | survived | score | with explained survivors |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for module, row in modules.items():
        score, explained = row["score"], row["score_with_justified"]
        lines.append(
            f"| `{module.removeprefix('acrb.').replace('.', '/')}.py` | {row['mutants']} | "
            f"{int(row['killed']) + int(row['timeout'])} | {row['survived']} | "  # type: ignore[call-overload]
            f"{score:.1%} | {explained:.1%} |" if score is not None and explained is not None
            else f"| `{module}` | not run | | | | |")
    return "\n".join(lines)


def mutant_globs(only: list[str] | None = None) -> list[str]:
    """The mutant names to run: every scoped function of every module (or of the modules in
    ``only``), as mutmut globs."""
    unknown = sorted(set(only or ()) - set(SCOPES))
    if unknown:
        raise SystemExit(f"not in SCOPES: {', '.join(unknown)} (one of: {', '.join(SCOPES)})")
    return [f"{module}.{glob}" for module, globs in SCOPES.items() for glob in globs
            if not only or module in only]


def merge_previous(modules: dict[str, dict[str, object]], previous: dict[str, object],
                   ran: dict[str, str]) -> dict[str, dict[str, object]]:
    """``modules`` (this run's) stamped with ``ran`` (its commit and date), and each module of
    :data:`SCOPES` that this run did not check taken from ``previous`` (the last report), with
    the commit and date it was measured on, so running some modules keeps the others' scores."""
    kept = previous.get("modules", {}) if isinstance(previous, dict) else {}
    merged: dict[str, dict[str, object]] = {}
    for module in SCOPES:
        row = modules.get(module)
        if (row is None or not row["mutants"]) and isinstance(kept, dict) and module in kept:
            old = kept[module]
            merged[module] = {**old, "commit": old.get("commit", previous.get("commit")),
                              "date": old.get("date", previous.get("date"))}
        elif row is not None:
            merged[module] = {**row, **ran}
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--globs", action="store_true",
                        help="print the mutant globs to pass to `mutmut run` and exit")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the score table as Markdown (docs/mutation.md)")
    parser.add_argument("--modules", nargs="+", metavar="MODULE",
                        help="with --globs: only these modules' mutants (e.g. acrb.redaction)")
    parser.add_argument("--recheck-timeouts", action="store_true",
                        help="first run the tests of every timed-out mutant again in a fresh "
                             "process (see recheck_timeouts) and score them by that")
    parser.add_argument("--in-process", action="store_true",
                        help="also run every scoped mutant mutmut has not run, each in a fresh "
                             "process (for modules whose tests hang when mutmut forks them)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes at a time for --recheck-timeouts and --in-process")
    args = parser.parse_args()
    if args.globs:
        print(" ".join(mutant_globs(args.modules)))
        return 0
    if args.recheck_timeouts or args.in_process:
        wanted = ("timeout", "not checked") if args.in_process else ("timeout",)
        recheck_timeouts(_timeouts(wanted), workers=args.workers)
    modules = collect()
    # The commit mutmut ran on (recorded in its stats), not the checkout's HEAD now.
    stats = ROOT / "mutants" / "mutmut-stats.json"
    ran_on = json.loads(stats.read_text()).get("git_commit") if stats.exists() else None
    commit = subprocess.run(["git", "rev-parse", "--short", ran_on or "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    from importlib.metadata import version

    today = dt.date.today().isoformat()
    # A module this run did not check keeps its last measured row, with that row's commit.
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    modules = merge_previous(modules, previous, {"commit": commit, "date": today})
    report = {"tool": f"mutmut {version('mutmut')}", "date": today,
              "commit": commit, "target": TARGET, "modules": modules}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    low = []
    print(f"{'module':28} {'mutants':>7} {'killed':>6} {'timeout':>7} {'survived':>8} "
          f"{'score':>6} {'unrun':>5}")
    for module, row in modules.items():
        print(f"{module:28} {row['mutants']:>7} {row['killed']:>6} {row['timeout']:>7} "
              f"{row['survived']:>8} {row['score']!s:>6} {row['not_checked']:>5}"
              f"  ({row['commit']}, {row['date']})")
        for survivor in row["survivors"]:  # type: ignore[attr-defined]
            print(f"    {survivor['mutant']}: {survivor['status']}"
                  f" -- {survivor['reason'] or 'NOT EXPLAINED'}")
        if row["score_with_justified"] is not None and row["score_with_justified"] < TARGET:
            low.append(module)
    if args.markdown:
        print(markdown_table(modules))
    if low:
        print(f"under {TARGET:.0%} (with explained survivors): {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
