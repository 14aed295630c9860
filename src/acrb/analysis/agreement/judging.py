"""What the judges said, and whether they say it equally for every group.

The ``judge`` stage writes, per model, one score table per judge (:class:`acrb.records.
ScoreRecord`: the judge's 1-5 scores per rubric axis, ``cue_retention`` in 0-1, or why it
abstained or erred) and the verdicts (:class:`acrb.records.VerdictRecord`: the ensemble score
per axis, ``needs_review`` and the judge outcomes). These functions turn them into the tables
the ``analyze`` stage writes and the report shows:

- :func:`judge_means`: the study's main table, the mean ensemble score per axis over judged
  requests, with a cluster-bootstrap interval over source images;
- :func:`judge_agreement`: judge-judge agreement per axis, overall and per source group:
  quadratic-weighted Cohen's kappa and Krippendorff's alpha;
- :func:`abstention_rates`: each judge's abstention and error rate, and the ensemble's
  needs-review rate, per source group, with Wilson intervals and a permutation test over
  sources of whether the rate differs between groups (a judge that abstains more for one group
  leaves that group's outcomes measured on fewer, and different, edits: the audit is biased);
- :func:`score_tests`: Kruskal-Wallis with Dunn's post hoc test and the proportional-odds model
  of each ensemble score by source group, Holm over the whole family.

Every function takes frames and returns a frame; nothing here reads files. The frame these
functions read is the analysis frame of :mod:`acrb.analysis.frame` with the verdict columns of
:func:`acrb.analysis.inputs.verdict_columns` joined.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import krippendorff
import numpy as np
import pandas as pd

from acrb.analysis import defaults
from acrb.analysis.agreement.judge_scores import kruskal_dunn, ordinal_model
from acrb.analysis.estimation.rates import wilson_interval
from acrb.analysis.estimation.resampling import (
    bootstrap_weights,
    delta_permutation_p,
    prepare_block,
)
from acrb.analysis.frame import CLUSTER_COLUMN, check_columns, usable_rows
from acrb.analysis.tests.pvalues import adjust
from acrb.demographics import SOURCE_DIMENSIONS
from acrb.records import SCORE_AXES
from acrb.storage import atomic_write_json, write_parquet

#: Axes scored 1-5 (ordinal); the rest (``cue_retention``) are fractions in 0-1 (interval).
ORDINAL_AXES: tuple[str, ...] = tuple(a for a in SCORE_AXES if a != "cue_retention")
#: The levels of an ordinal axis.
SCORE_LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)

#: The pseudo-dimension and group of rows that pool every source.
ALL = "all"

#: Score statuses of a request the judge was asked about (``not_judged`` ones it was not).
ASKED_STATUSES: tuple[str, ...] = ("scored", "abstained", "error")

MEAN_COLUMNS: tuple[str, ...] = ("axis", "n", "n_sources", "mean", "ci_low", "ci_high",
                                 "method")
AGREEMENT_COLUMNS: tuple[str, ...] = ("judges", "axis", "dimension", "group", "n_pairs",
                                      "kappa", "alpha", "level", "note")
ABSTENTION_COLUMNS: tuple[str, ...] = ("judge", "event", "dimension", "group", "n", "k", "rate",
                                       "ci_low", "ci_high", "delta", "p_value", "p_adjusted",
                                       "test", "note")
SCORE_TEST_COLUMNS: tuple[str, ...] = ("axis", "dimension", "test", "statistic", "df",
                                       "p_value", "p_adjusted", "significant", "n", "n_missing",
                                       "posthoc", "note")

#: The ``judge`` of the needs-review rows of :func:`abstention_rates`.
ENSEMBLE = "ensemble"


def has_verdicts(frame: pd.DataFrame) -> bool:
    """Whether the analysis frame carries the judges' verdicts (judges ran on this model)."""
    return "verdict_status" in frame.columns


def judge_means(
    frame: pd.DataFrame,
    *,
    confidence: float = 0.95,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Mean ensemble score per rubric axis over the judged requests of one model.

    A request counts on an axis when the model answered it (status ok or refused) and the
    ensemble has a score for the axis (refused and unjudged requests have none; an axis the
    rubric did not ask, e.g. ``aging_accuracy`` outside aging prompts, neither). ``n`` counts
    those requests, ``n_sources`` their source images.

    Interval: percentile cluster bootstrap over source images (Davison & Hinkley 1997,
    *Bootstrap Methods and their Application*, ch. 3.8; Field & Welsh 2007, JRSS-B 69:369-390):
    each replicate draws sources with replacement (multinomial weights W_s, from
    :func:`acrb.analysis.estimation.resampling.bootstrap_weights`) and takes the ratio mean
    Σ W_s T_s / Σ W_s N_s of the per-source score totals T_s over counts N_s. A source's
    requests share its face, so this is the unit; prompts are held fixed (inference
    conditional on the prompt set). With one source the interval is NaN.

    Columns :data:`MEAN_COLUMNS`, one row per axis of :data:`acrb.records.SCORE_AXES`
    (n = 0 and NaN where no request has the axis).
    """
    check_columns(frame, ["status", CLUSTER_COLUMN])
    rows = []
    usable = usable_rows(frame)
    rng = np.random.default_rng(seed)
    tail = (1.0 - confidence) / 2.0
    for axis in SCORE_AXES:
        scores = (pd.to_numeric(usable[axis], errors="coerce") if axis in usable
                  else pd.Series(np.nan, index=usable.index))
        scored = usable.loc[scores.notna(), [CLUSTER_COLUMN]].assign(score=scores.dropna())
        by_source = scored.groupby(CLUSTER_COLUMN, sort=True)["score"].agg(["sum", "count"])
        n = int(by_source["count"].sum())
        mean = float(by_source["sum"].sum() / n) if n else math.nan
        low = high = math.nan
        if len(by_source) > 1:
            weights, _ = bootstrap_weights(rng, np.zeros(len(by_source), np.int64),
                                           np.zeros(1, np.int64), n_boot, "sources")
            totals = weights @ by_source["sum"].to_numpy(float)
            counts = weights @ by_source["count"].to_numpy(float)
            replicates = totals[counts > 0] / counts[counts > 0]
            low, high = (float(q) for q in np.quantile(replicates, [tail, 1.0 - tail]))
        rows.append({"axis": axis, "n": n, "n_sources": len(by_source), "mean": mean,
                     "ci_low": low, "ci_high": high,
                     "method": "percentile cluster bootstrap over sources"})
    return pd.DataFrame(rows, columns=list(MEAN_COLUMNS))


def _agreement(a: np.ndarray, b: np.ndarray, axis: str) -> tuple[float, float, str]:
    """Kappa, alpha and a note for paired scores ``a``, ``b`` of one axis (NaN where
    undefined)."""
    from sklearn.metrics import cohen_kappa_score

    ordinal = axis in ORDINAL_AXES
    if len(a) < 2:
        return math.nan, math.nan, "fewer than two pairs"
    if len(np.unique(np.concatenate([a, b]))) < 2:
        return math.nan, math.nan, "one category only: agreement undefined"
    notes = []
    if ordinal:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            kappa = float(cohen_kappa_score(a.astype(int), b.astype(int),
                                            labels=list(SCORE_LEVELS), weights="quadratic"))
        alpha = float(krippendorff.alpha(reliability_data=np.vstack([a, b]).astype(float),
                                         level_of_measurement="ordinal",
                                         value_domain=list(SCORE_LEVELS)))
    else:
        kappa = math.nan
        notes.append("kappa not defined for a fraction axis (see alpha, interval)")
        alpha = float(krippendorff.alpha(reliability_data=np.vstack([a, b]).astype(float),
                                         level_of_measurement="interval"))
    if not math.isfinite(kappa) and ordinal:
        notes.append("kappa undefined: one judge used one category only")
    return kappa, alpha, "; ".join(notes)


def judge_agreement(scores: Mapping[str, pd.DataFrame], frame: pd.DataFrame) -> pd.DataFrame:
    """Agreement between each pair of judges per axis, overall and per source group.

    ``scores``: judge name -> its score table (ScoreRecord rows), first judge first;
    ``frame``: the analysis frame (``request_id`` and the source dimensions). A pair is a
    request both judges scored (status ``scored``) with a value for the axis.

    - Quadratic-weighted Cohen's kappa (Cohen 1968, "Weighted kappa", Psych Bull 70:213-220;
      ``sklearn.metrics.cohen_kappa_score(weights="quadratic")`` with the labels 1-5), for the
      1-5 axes only: a fraction (``cue_retention``) has no categories, its kappa is NaN.
    - Krippendorff's alpha (Krippendorff 2011, "Computing Krippendorff's alpha-reliability";
      package ``krippendorff``), ordinal metric on the 1-5 axes (value domain 1-5), interval
      metric on ``cue_retention``.

    Both are NaN with a ``note`` where undefined: fewer than two pairs, or every score of the
    cell in one category (no disagreement is expected, so chance-corrected agreement is 0/0).
    Rows: per pair of judges (``"a vs b"``), axis, and dimension ``"all"`` (group ``"all"``)
    followed by each source dimension's groups in vocabulary order; columns
    :data:`AGREEMENT_COLUMNS`. Empty with fewer than two judges.
    """
    check_columns(frame, ["request_id", *SOURCE_DIMENSIONS])
    names = list(scores)
    design = frame[["request_id", *SOURCE_DIMENSIONS]].drop_duplicates("request_id")
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            pair = _scored(scores[first]).merge(_scored(scores[second]), on="request_id",
                                                suffixes=("_a", "_b"))
            pair = pair.merge(design, on="request_id", how="inner")
            cells: list[tuple[str, str, pd.Series]] = [(ALL, ALL, pd.Series(True,
                                                                            index=pair.index))]
            for dimension, vocabulary in SOURCE_DIMENSIONS.items():
                values = pair[dimension].astype(str)
                cells += [(dimension, g, values == g) for g in vocabulary]
            for axis in SCORE_AXES:
                for dimension, group, mask in cells:
                    a = pd.to_numeric(pair.loc[mask, f"{axis}_a"], errors="coerce")
                    b = pd.to_numeric(pair.loc[mask, f"{axis}_b"], errors="coerce")
                    both = a.notna() & b.notna()
                    kappa, alpha, note = _agreement(a[both].to_numpy(float),
                                                    b[both].to_numpy(float), axis)
                    rows.append({"judges": f"{first} vs {second}", "axis": axis,
                                 "dimension": dimension, "group": group,
                                 "n_pairs": int(both.sum()), "kappa": kappa, "alpha": alpha,
                                 "level": "ordinal" if axis in ORDINAL_AXES else "interval",
                                 "note": note})
    return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))


def _scored(table: pd.DataFrame) -> pd.DataFrame:
    """A score table's scored rows: ``request_id`` and the axes."""
    check_columns(table, ["request_id", "status", *SCORE_AXES])
    return table.loc[table["status"] == "scored", ["request_id", *SCORE_AXES]]


def _event_rates(
    frame: pd.DataFrame, event: pd.Series, asked: pd.Series, judge: str, name: str,
    confidence: float, n_perm: int, seed: int,
) -> list[dict]:
    """Rows of :func:`abstention_rates` for one judge and event (True where it happened, among
    the ``asked`` requests)."""
    asked_mask = asked.fillna(False).to_numpy(dtype=bool)
    happened = pd.array(event.fillna(False).to_numpy(dtype=bool), dtype="boolean")
    happened[~asked_mask] = pd.NA
    # The rows asked count as answered ("ok"), the rest as missing: the frame conventions of
    # acrb.analysis.frame, so the resampling machinery counts exactly the asked requests.
    cells = frame.assign(status=np.where(asked_mask, "ok", "missing"), _event=happened)
    counted = cells.loc[asked_mask]
    rows = []
    k_all, n_all = int(counted["_event"].sum()), len(counted)
    low, high = wilson_interval(np.array([k_all]), np.array([n_all]), confidence)
    rows.append({"judge": judge, "event": name, "dimension": ALL, "group": ALL, "n": n_all,
                 "k": k_all, "rate": k_all / n_all if n_all else math.nan,
                 "ci_low": float(low[0]), "ci_high": float(high[0]), "delta": math.nan,
                 "p_value": math.nan, "test": "", "note": ""})
    for dimension, vocabulary in SOURCE_DIMENSIONS.items():
        values = counted[dimension].astype(str)
        n = np.array([(values == g).sum() for g in vocabulary])
        k = np.array([counted.loc[values == g, "_event"].sum() for g in vocabulary])
        low, high = wilson_interval(k, n, confidence)
        p_value, delta, note = math.nan, math.nan, ""
        if n_all and (n > 0).sum() >= 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                block = prepare_block(cells, "_event", dimension)
            test = delta_permutation_p(block, n_perm, seed)
            p_value, delta = test.p_value, test.observed
        else:
            note = "fewer than two groups asked: no test"
        for g, gn, gk, lo, hi in zip(vocabulary, n, k, low, high, strict=True):
            rows.append({"judge": judge, "event": name, "dimension": dimension, "group": g,
                         "n": int(gn), "k": int(gk), "rate": gk / gn if gn else math.nan,
                         "ci_low": float(lo), "ci_high": float(hi), "delta": delta,
                         "p_value": p_value,
                         "test": "permutation over sources (Δ = max - min rate)",
                         "note": note})
    return rows


def abstention_rates(
    scores: Mapping[str, pd.DataFrame],
    frame: pd.DataFrame,
    *,
    confidence: float = 0.95,
    n_perm: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
) -> pd.DataFrame:
    """Per judge, its abstention and error rate per source group; and the ensemble's
    needs-review rate per group.

    Denominators: a judge's rates count the requests it was asked about (score status scored,
    abstained or error; ``not_judged`` requests are not asked); the needs-review rate counts the
    requests with a verdict other than ``not_judged`` among those the model answered. Intervals:
    Wilson score intervals (:func:`acrb.analysis.estimation.rates.wilson_interval`), which count
    requests as independent: a descriptive band.

    Test (per judge, event and dimension): does the rate differ between groups? Δ = max − min
    of the group rates, with its p-value from permuting group labels across source images
    within strata of the other dimensions (:func:`acrb.analysis.estimation.resampling.
    delta_permutation_p`, the test the audit's own Δ uses), so a source's requests move
    together and clustering within a face does not inflate the evidence. ``p_adjusted``: Holm
    over every test of the table. The test's Δ and p are repeated on each group row of their
    dimension; the ``all`` rows carry the pooled rate.

    Columns :data:`ABSTENTION_COLUMNS`; events ``abstention``, ``error`` (per judge) and
    ``needs_review`` (judge ``"ensemble"``, when the frame has verdicts).
    """
    check_columns(frame, ["request_id", "status", "source_id", "prompt_id", "category",
                          *SOURCE_DIMENSIONS])
    rows: list[dict] = []
    for judge, table in scores.items():
        check_columns(table, ["request_id", "status"])
        status = frame[["request_id"]].merge(table[["request_id", "status"]],
                                             on="request_id", how="left")["status"]
        status.index = frame.index
        asked = status.isin(ASKED_STATUSES)
        for event, value in (("abstention", "abstained"), ("error", "error")):
            rows += _event_rates(frame, status == value, asked, judge, event, confidence,
                                 n_perm, seed)
    if has_verdicts(frame):
        asked = (frame["status"].isin(("ok", "refused"))
                 & frame["verdict_status"].isin(("scored", "abstained")))
        rows += _event_rates(frame, frame["judge_needs_review"].astype("boolean"), asked,
                             ENSEMBLE, "needs_review", confidence, n_perm, seed)
    table = pd.DataFrame(rows, columns=[c for c in ABSTENTION_COLUMNS if c != "p_adjusted"])
    table["p_adjusted"] = math.nan
    if len(table):
        # One p per (judge, event, dimension): adjust those, then spread back to the groups.
        tests = table.loc[table["dimension"] != ALL].drop_duplicates(
            ["judge", "event", "dimension"])[["judge", "event", "dimension", "p_value"]]
        tests["p_adjusted"] = adjust(tests["p_value"].to_numpy(float), "holm")
        table = table.drop(columns="p_adjusted").merge(
            tests.drop(columns="p_value"), on=["judge", "event", "dimension"], how="left")
    return table[list(ABSTENTION_COLUMNS)]


def _posthoc_summary(posthoc: pd.DataFrame, alpha: float) -> str:
    """Dunn's pairs significant at ``alpha`` (Holm-adjusted), as ``a vs b (p=…)``."""
    if posthoc.empty:
        return ""
    pairs = []
    names = list(posthoc.index)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            p = posthoc.loc[a, b]
            if pd.notna(p) and p < alpha:
                pairs.append(f"{a} vs {b} (p={p:.3g})")
    return "; ".join(pairs)


def score_tests(frame: pd.DataFrame, alpha: float = 0.05,
                axes: Sequence[str] = SCORE_AXES, *, ordinal: bool = True) -> pd.DataFrame:
    """Do the ensemble scores differ between source groups? Per axis and dimension:

    - Kruskal-Wallis with Dunn's post hoc test on each source's mean score
      (:func:`acrb.analysis.agreement.judge_scores.kruskal_dunn`, unit = source), for every axis;
    - the proportional-odds model with the robust score test clustered on source
      (:func:`acrb.analysis.agreement.judge_scores.ordinal_model`), for the 1-5 axes (a 0-1 fraction
      is not an ordinal score), unless ``ordinal`` is False.

    ``p_adjusted``: Holm over the whole table (every axis, dimension and test, one family);
    ``significant`` at ``alpha``; ``posthoc``: Dunn's pairs significant at ``alpha``. Axes
    with no score at all are left out. Columns :data:`SCORE_TEST_COLUMNS`.
    """
    rows = []
    for axis in axes:
        if axis not in frame or pd.to_numeric(usable_rows(frame)[axis],
                                              errors="coerce").notna().sum() == 0:
            continue
        for dimension in SOURCE_DIMENSIONS:
            kw = kruskal_dunn(frame, axis, dimension)
            rows.append({"axis": axis, "dimension": dimension, "test": "Kruskal-Wallis + Dunn",
                         "statistic": kw.statistic, "df": kw.df, "p_value": kw.p_value,
                         "n": kw.n, "n_missing": kw.n_missing,
                         "posthoc": _posthoc_summary(kw.posthoc, alpha),
                         "note": kw.reason or ""})
            if not ordinal or axis not in ORDINAL_AXES:
                continue
            om = ordinal_model(frame, axis, dimension)
            rows.append({"axis": axis, "dimension": dimension,
                         "test": "proportional odds (score test)", "statistic": om.statistic,
                         "df": om.df, "p_value": om.p_value, "n": om.n,
                         "n_missing": om.n_missing, "posthoc": "",
                         "note": "; ".join([*([om.reason] if om.reason else []), *om.notes])})
    table = pd.DataFrame(rows, columns=[c for c in SCORE_TEST_COLUMNS
                                        if c not in ("p_adjusted", "significant")])
    adjusted = adjust(table["p_value"].to_numpy(float), "holm")
    table["p_adjusted"] = adjusted
    table["significant"] = pd.array(
        [None if not np.isfinite(p) else bool(p < alpha) for p in adjusted], dtype="boolean")
    return table[list(SCORE_TEST_COLUMNS)]


#: The files :func:`write_judging` writes in a model's analysis folder.
JUDGING_FILES: dict[str, str] = {"means": "judge_means.parquet",
                                 "agreement": "agreement.parquet",
                                 "abstention": "abstention.parquet",
                                 "tests": "score_tests.parquet"}


@dataclass(frozen=True)
class JudgingTables:
    """One model's judge analysis: :func:`judge_means`, :func:`judge_agreement`,
    :func:`abstention_rates` and :func:`score_tests`, for ``judges`` (first judge first)."""

    judges: tuple[str, ...]
    means: pd.DataFrame
    agreement: pd.DataFrame
    abstention: pd.DataFrame
    tests: pd.DataFrame


def build_judging(
    frame: pd.DataFrame,
    scores: Mapping[str, pd.DataFrame],
    *,
    confidence: float = 0.95,
    alpha: float = 0.05,
    n_boot: int = defaults.BOOTSTRAP_RESAMPLES,
    n_perm: int = defaults.PERMUTATIONS,
    seed: int = defaults.SEED,
    ordinal: bool = True,
) -> JudgingTables:
    """Every judge table of one model, from its analysis frame (with verdicts joined) and its
    judges' score tables (first judge first)."""
    return JudgingTables(
        judges=tuple(scores),
        means=judge_means(frame, confidence=confidence, n_boot=n_boot, seed=seed),
        agreement=judge_agreement(scores, frame),
        abstention=abstention_rates(scores, frame, confidence=confidence, n_perm=n_perm,
                                    seed=seed),
        tests=score_tests(frame, alpha, ordinal=ordinal),
    )


def write_judging(tables: JudgingTables | None, folder: Path) -> None:
    """Write the judge tables in ``folder`` (Parquet, atomically) and ``judging.json`` (the
    judges, in order); with None, remove any left from a run that had judges, so a report
    never shows judges that are no longer configured."""
    index = folder / "judging.json"
    if tables is None:
        for name in [*JUDGING_FILES.values(), index.name]:
            (folder / name).unlink(missing_ok=True)
        return
    for attribute, name in JUDGING_FILES.items():
        write_parquet(getattr(tables, attribute), folder / name)
    atomic_write_json(index, {"judges": list(tables.judges)})


def read_judging(folder: Path) -> JudgingTables | None:
    """The judge tables :func:`write_judging` wrote in ``folder``; None when the model was
    analysed without judges."""
    index = folder / "judging.json"
    if not index.exists():
        return None
    judges = json.loads(index.read_text())["judges"]
    tables = {attribute: pd.read_parquet(folder / name)
              for attribute, name in JUDGING_FILES.items()}
    return JudgingTables(judges=tuple(judges), **tables)


def judging_metrics(tables: JudgingTables) -> dict[str, float]:
    """Flat metric keys of the judge tables (data/analysis/<model>/metrics.csv and MLflow):

    - ``judge.<axis>.mean`` (and ``.ci_low``, ``.ci_high``, ``.n``): the mean ensemble score;
    - ``agreement.<axis>.kappa`` and ``agreement.<axis>.alpha`` (and ``.n_pairs``): the first
      two judges' agreement over all sources (per group: the agreement table);
    - ``abstention.<judge>.rate``, ``error.<judge>.rate``, ``needs_review.rate``, and
      ``abstention.<judge>.<dimension>.p_adjusted`` (likewise ``error``, ``needs_review``):
      the pooled rate and the Holm-adjusted test of a difference between groups;
    - ``score_test.<axis>.<dimension>.kruskal.p_adjusted`` and ``….ordinal.p_adjusted``.
    """
    metrics: dict[str, float] = {}
    for row in tables.means.to_dict("records"):
        for field_name in ("mean", "ci_low", "ci_high", "n"):
            metrics[f"judge.{row['axis']}.{field_name}"] = float(row[field_name])
    if len(tables.agreement):
        first_pair = tables.agreement["judges"].iloc[0]
        overall = tables.agreement[(tables.agreement["judges"] == first_pair)
                                   & (tables.agreement["dimension"] == ALL)]
        for row in overall.to_dict("records"):
            for field_name in ("kappa", "alpha", "n_pairs"):
                metrics[f"agreement.{row['axis']}.{field_name}"] = float(row[field_name])
    for row in tables.abstention.to_dict("records"):
        prefix = (row["event"] if row["judge"] == ENSEMBLE
                  else f"{row['event']}.{row['judge']}")
        if row["dimension"] == ALL:
            metrics[f"{prefix}.rate"] = float(row["rate"])
        else:
            metrics[f"{prefix}.{row['dimension']}.p_adjusted"] = float(row["p_adjusted"])
    short = {"Kruskal-Wallis + Dunn": "kruskal", "proportional odds (score test)": "ordinal"}
    for row in tables.tests.to_dict("records"):
        metrics[f"score_test.{row['axis']}.{row['dimension']}.{short[row['test']]}"
                f".p_adjusted"] = float(row["p_adjusted"])
    return metrics
