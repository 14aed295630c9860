"""Stage `analyze`: rates, disparities and (for simulated models) planted vs measured.

Per model: R(a), E(a) and lightening rates per category x source group with Wilson intervals, Δ =
max − min per category and dimension with simultaneous intervals and Holm-corrected tests
(:mod:`acrb.analysis`). A text-to-image model gets its refusal rate per prompt attribute and the
ACRB Δ over attributes, clustered on base prompt (:mod:`acrb.analysis.experiments.attributes`); the
comparisons across models (hypotheses, SCS, comparison figures) are about the editors. When judges
ran on a model (params ``judge.use`` and the judge stage's verdicts), its frame carries the judge
outcomes, which go through the same rates and Δ tables, and the judge tables of
:mod:`acrb.analysis.agreement.judging` (mean scores, agreement, abstention, score tests) are written
beside its section. Writes data/analysis/<model>/*.parquet with every flat metric in
data/analysis/<model>/metrics.csv, the headline metrics/audit/<model>/*.json (DVC metrics,
:mod:`acrb.analysis.outputs.headline`) and every model's Δ under short keys in metrics/headline.json
(for `dvc exp show`), plots/*.csv (DVC plots) and plots/figures/*.png, and logs one MLflow run per
model with the same metric keys, so the MLflow compare view lines models up; each model's headline
goes on the pipeline's parent run too, as ``<model>.delta_refusal`` and so on, with the experiment's
shared runs view that shows those columns (:mod:`acrb.tracking`).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import pandas as pd
from tqdm import tqdm

from acrb import layout, rounds
from acrb.analysis.agreement.judging import (
    JudgingTables,
    build_judging,
    has_verdicts,
    judging_metrics,
    write_judging,
)
from acrb.analysis.experiments.congruence import scs_rows
from acrb.analysis.experiments.winobias import write_winobias
from acrb.analysis.frame import checked_frame
from acrb.analysis.inputs import (
    REQUEST_COLUMNS,
    T2I_REQUEST_COLUMNS,
    analysis_frame,
    rewritten_by_judge,
)
from acrb.analysis.outcomes import (
    OUTCOME_NAMES,
    OUTCOMES,
    outcome_phrase,
)
from acrb.analysis.outputs import figure_cache
from acrb.analysis.outputs.dvc_plots import dvc_plot_jobs, remove_stale_plots
from acrb.analysis.outputs.figures import model_comparison, plotting, scs_points, skin_tone_shift
from acrb.analysis.outputs.headline import (
    dumps,
    headline_files,
    headline_value,
    write_detailed_metrics,
    write_headline,
)
from acrb.analysis.outputs.section import (
    ModelSection,
    build_model_section,
    section_figure_jobs,
    write_section,
)
from acrb.analysis.outputs.t2i_section import (
    AttributeSection,
    build_attribute_section,
    write_attribute_section,
)
from acrb.analysis.tests.hypotheses import evaluate_hypotheses
from acrb.config import ModelEntry
from acrb.errors import ConfigError
from acrb.records import SCORE_AXES, ScoreRecord, read_table
from acrb.stages.context import StageContext, stage_workers
from acrb.storage import (
    atomic_write_json,
    atomic_write_text,
    remove_stale_temporaries,
    write_csv,
    write_parquet,
)
from acrb.tracking import HEADLINE_OUTCOMES, parent_headline, runs_view_columns, stage_run

if TYPE_CHECKING:
    from acrb.analysis.experiments.arms import ArmTables

_REQUEST_COLUMNS = REQUEST_COLUMNS
_T2I_REQUEST_COLUMNS = T2I_REQUEST_COLUMNS
#: ``OPENBLAS_THREAD_TIMEOUT`` of :func:`run`'s pool processes (unless the environment sets
#: it): OpenBLAS's threads wait 2**4 cycles for more work, then sleep, instead of spinning
#: 2**28 cycles (its default). Beside other busy processes (the pool's own, on two CPUs) the
#: spinning took half of each job's CPU time: an editor's tables and judge tables took 28-37 s
#: of CPU time instead of 15-17 s (two at once on 2 CPUs). How threads wait changes nothing
#: they compute: the outputs are the same bytes (one thread instead of two would change the
#: GEE tests' last digits).
WORKER_BLAS_THREAD_TIMEOUT = "4"
_P = ParamSpec("_P")
_T = TypeVar("_T")
#: Every model's Δ per headline outcome under keys no other metrics file or param has
#: (``synthetic-biased.d_refusal``): `dvc exp show` heads a column with the file's path only
#: when its key is not unique, so these columns stay narrow enough to read (docs/results.md).
SHORT_HEADLINE = Path("metrics/headline.json")


@dataclass(frozen=True)
class ModelAnalysis:
    model: str
    key: str
    simulated: bool
    frame: pd.DataFrame
    section: ModelSection | AttributeSection
    metrics: dict[str, float]
    task: str = "i2i"
    #: The judge tables, when judges ran on this model (:mod:`acrb.analysis.agreement.judging`).
    judging: JudgingTables | None = None

    @property
    def rates(self) -> pd.DataFrame:
        return self.section.rates

    @property
    def disparities(self) -> pd.DataFrame:
        return self.section.disparities

    @property
    def planted(self) -> pd.DataFrame | None:
        return self.section.planted


def read_scores(ctx: StageContext, model: str) -> dict[str, pd.DataFrame]:
    """Each configured judge's score table of ``model`` (``judge.use`` order), those written,
    its stored scores checked against the rubric's ranges (a table edited after the judge
    stage wrote it is refused, naming the requests, never analysed)."""
    from acrb.judges.rubric import check_stored_scores, load_rubric, table_answers

    tables = {}
    rubric = None
    for judge in ctx.params.judge.use:
        path = ctx.path(layout.scores_table(model, judge))
        if path.exists():
            table = read_table(path, ScoreRecord)
            rubric = rubric or load_rubric(ctx.path(ctx.params.judge.rubric))
            check_stored_scores(rubric, judge, path, table_answers(table, SCORE_AXES),
                                fix=rewritten_by_judge(model))
            tables[judge] = table
    return tables


def add_planted(frame: pd.DataFrame, entry: ModelEntry) -> pd.DataFrame:
    """Per-request planted probabilities, from the simulated editor's published config."""
    editor = entry.build()
    design = ["category", "race", "gender", "age"]
    cells = frame[design].drop_duplicates()
    planted = [
        editor.planted_probabilities(  # type: ignore[attr-defined]
            row.category, {"race": row.race, "gender": row.gender, "age": row.age}
        )
        for row in cells.itertuples(index=False)
    ]
    table = cells.assign(
        planted_refusal=[p["refusal"] for p in planted],
        planted_erasure=[p["erasure"] for p in planted],
        planted_lightening=[p["lightening"] for p in planted],
    )
    return frame.merge(table, on=design, how="left")


def add_planted_refusal(frame: pd.DataFrame, entry: ModelEntry, model: str) -> pd.DataFrame:
    """Per-request planted refusal probability, from the simulated generator's published config.

    An attribute offset that no planned prompt carries would plant nothing: it stops the stage
    with its name rather than pass as a check that was made.
    """
    generator = entry.build()
    planted_attributes: set[str] = generator.planted.refusal.attributes()  # type: ignore[attr-defined]
    unknown = sorted(planted_attributes - set(frame["attribute"].astype(str)))
    if unknown:
        raise ConfigError(
            f"simulated generator '{model}' plants refusal offsets for attributes {unknown}, "
            "which no planned prompt has",
            "use `dimension:value` ids of prompts.synthesis.attributes (e.g. religion:muslim) in "
            f"models.{model}.config.refusal",
        )
    cells = frame[["category", "attribute"]].drop_duplicates()
    table = cells.assign(planted_refusal=[
        generator.planted_refusal(row.category, row.attribute)  # type: ignore[attr-defined]
        for row in cells.itertuples(index=False)])
    return frame.merge(table, on=["category", "attribute"], how="left")


def t2i_metric_dict(section: AttributeSection, frame: pd.DataFrame) -> dict[str, float]:
    """Flat metric keys of a text-to-image model: refusal rate per attribute
    (``refusal_rate.<dimension>.<value>``, ``refusal_rate.neutral``), the ACRB Δ over every
    attribute (``delta_refusal``) and per dimension (``delta_refusal.<dimension>``), each with
    its interval and, where the section has the equivalence test, its p-value
    (``<delta key>.equivalence_p``, absent when untestable) and verdict (``.equivalent``, 1 or
    0), and planted-vs-measured coverage for a simulated model."""
    metrics: dict[str, float] = {
        "requests.total": float(len(frame)),
        "requests.error": float((frame["status"] == "error").sum()),
        "requests.missing": float((frame["status"] == "missing").sum()),
    }
    for outcome in sorted(set(section.disparities["outcome"])):
        label = OUTCOME_NAMES[outcome].metric
        gaps = section.disparities[section.disparities["outcome"] == outcome]
        metrics[f"flagged.{label}"] = float(gaps["flagged"].sum())
        for row in gaps.to_dict("records"):
            name = (f"delta_{label}" if row["dimension"] == "all"
                    else f"delta_{label}.{row['dimension']}")
            metrics[name] = float(row["delta"])
            metrics[f"{name}.ci_low"] = float(row["ci_low"])
            metrics[f"{name}.ci_high"] = float(row["ci_high"])
        if section.equivalence is not None:
            tests = section.equivalence[section.equivalence["outcome"] == outcome]
            for row in tests.to_dict("records"):
                name = (f"delta_{label}" if row["dimension"] == "all"
                        else f"delta_{label}.{row['dimension']}")
                metrics[f"{name}.equivalence_p"] = float(row["p_value"])
                metrics[f"{name}.equivalent"] = float(bool(row["equivalent"]))
        rates = section.rates[section.rates["outcome"] == outcome]
        for row in rates.to_dict("records"):
            name = f"{label}_rate.{str(row['attribute']).replace(':', '.')}"
            metrics[name] = float(row["rate"])
            metrics[f"{name}.ci_low"] = float(row["ci_low"])
            metrics[f"{name}.ci_high"] = float(row["ci_high"])
        if section.planted is not None:
            rows = section.planted[section.planted["outcome"] == outcome]
            deltas = rows[rows["value"] == "Δ"]
            metrics[f"planted.delta_{label}.coverage"] = float(deltas["covered"].mean())
            metrics[f"planted.{label}_rate.coverage"] = float(
                rows[rows["value"] != "Δ"]["covered"].mean())
    return {k: (round(v, 6) if not math.isnan(v) else v) for k, v in metrics.items()}


def analyze_t2i_model(ctx: StageContext, model: str) -> ModelAnalysis:
    """The T2I analysis of ``model``: refusal by prompt attribute, clustered on base prompt."""
    entry = ctx.params.model(model)
    cfg = ctx.params.analyze
    simulated = entry.model_class().simulated
    frame = analysis_frame(ctx, model, _T2I_REQUEST_COLUMNS)
    if simulated:
        frame = checked_frame(add_planted_refusal(frame, entry, model))
    section = build_attribute_section(
        frame, model, entry.key, simulated, ctx.path(layout.PLOTS_DIR / "figures"),
        cfg.confidence, cfg.alpha, simultaneous=cfg.simultaneous_intervals, test=cfg.test,
        bootstrap=cfg.bootstrap, permutations=cfg.permutations, seed=cfg.seed,
        margin=cfg.equivalence_margin)
    return ModelAnalysis(model=model, key=entry.key, simulated=simulated, frame=frame,
                         section=section, metrics=t2i_metric_dict(section, frame), task="t2i")


def metric_dict(rates: pd.DataFrame, gaps: pd.DataFrame, planted: pd.DataFrame | None,
                frame: pd.DataFrame) -> dict[str, float]:
    """Flat metric keys shared by every model (MLflow and data/analysis/<model>/metrics.csv)."""
    metrics: dict[str, float] = {
        "requests.total": float(len(frame)),
        "requests.error": float((frame["status"] == "error").sum()),
        "requests.missing": float((frame["status"] == "missing").sum()),
    }
    # Only the outcomes the frame measured: judge outcomes exist when judges ran.
    measured = [o for o in OUTCOMES if o in set(gaps["outcome"])]
    for outcome in measured:
        label = OUTCOME_NAMES[outcome].metric
        out_gaps = gaps[gaps["outcome"] == outcome]
        pooled = out_gaps[out_gaps["category"] == "all"]
        metrics[f"delta_{label}"] = float(pooled["delta"].max()) if len(pooled) else math.nan
        metrics[f"flagged.{label}"] = float(out_gaps["flagged"].sum())
        for row in out_gaps.to_dict("records"):
            cell = (row["dimension"] if row["category"] == "all"
                    else f"{row['category']}.{row['dimension']}")
            metrics[f"delta_{label}.{cell}"] = float(row["delta"])
            metrics[f"delta_{label}.{cell}.ci_low"] = float(row["ci_low"])
            metrics[f"delta_{label}.{cell}.ci_high"] = float(row["ci_high"])
        out_rates = rates[rates["outcome"] == outcome]
        for row in out_rates.to_dict("records"):
            cell = (f"{row['dimension']}.{row['value']}" if row["category"] == "all"
                    else f"{row['category']}.{row['dimension']}.{row['value']}")
            metrics[f"{label}_rate.{cell}"] = float(row["rate"])
    if planted is not None:
        for outcome in measured:
            label = OUTCOME_NAMES[outcome].metric
            rows = planted[planted["outcome"] == outcome]
            deltas = rows[rows["value"] == "Δ"]
            if len(deltas):
                metrics[f"planted.delta_{label}.coverage"] = float(deltas["covered"].mean())
            if len(rows):
                metrics[f"planted.{label}_rate.coverage"] = float(
                    rows[rows["value"] != "Δ"]["covered"].mean())
    return {k: (round(v, 6) if not math.isnan(v) else v) for k, v in metrics.items()}


def analyze_model(ctx: StageContext, model: str) -> ModelAnalysis:
    """One model's analysis in this process: its section (tables and figures) and, when
    judges ran on it, its judge tables (:mod:`acrb.analysis.agreement.judging`)."""
    result = model_section(ctx, model)
    if result.task != "i2i":
        return result
    return with_judging(result, judge_tables(ctx, model, result.frame))


def model_section(ctx: StageContext, model: str, *, draw_figures: bool = True) -> ModelAnalysis:
    """:func:`analyze_model` without the judge tables. With ``draw_figures`` False an editor's
    figures are listed in its section but not drawn
    (:func:`acrb.analysis.outputs.section.section_figure_jobs` draws them); a text-to-image model's
    one figure is drawn either way."""
    entry = ctx.params.model(model)
    if entry.model_class().task == "t2i":
        return analyze_t2i_model(ctx, model)
    cfg = ctx.params.analyze
    simulated = entry.model_class().simulated
    frame = analysis_frame(ctx, model)
    if simulated:
        frame = checked_frame(add_planted(frame, entry))
    section = build_model_section(frame, model, entry.key, simulated,
                                  ctx.path(layout.PLOTS_DIR / "figures"), cfg.confidence,
                                  cfg.alpha, simultaneous=cfg.simultaneous_intervals,
                                  permutations=cfg.permutations, seed=cfg.seed,
                                  bootstrap=cfg.bootstrap, resample=cfg.resample,
                                  test=cfg.test, power=cfg.power, tests=True,
                                  draw_figures=draw_figures)
    metrics = metric_dict(section.rates, section.disparities, section.planted, frame)
    return ModelAnalysis(model=model, key=entry.key, simulated=simulated, frame=frame,
                         section=section, metrics=metrics)


def judge_tables(ctx: StageContext, model: str, frame: pd.DataFrame) -> JudgingTables | None:
    """The judge tables of an editor from its analysis frame; None when no judge ran on it."""
    if not has_verdicts(frame):
        return None
    cfg = ctx.params.analyze
    return build_judging(frame, read_scores(ctx, model), confidence=cfg.confidence,
                         alpha=cfg.alpha, n_boot=cfg.bootstrap, n_perm=cfg.permutations,
                         seed=cfg.seed, ordinal=cfg.ordinal_model)


def with_judging(result: ModelAnalysis, judging: JudgingTables | None) -> ModelAnalysis:
    """``result`` with its judge tables, their metrics added to its metrics."""
    if judging is None:
        return result
    result.metrics.update({k: (round(v, 6) if not math.isnan(v) else v)
                           for k, v in judging_metrics(judging).items()})
    return dataclasses.replace(result, judging=judging)




def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    write_csv(frame, path, float_format="%.6g")


@contextmanager
def _settled_heap(libraries: bool = True) -> Iterator[None]:
    """The objects alive when the analysis starts, kept out of garbage collections until it
    ends (:func:`gc.freeze`), so that a collection walks what the analysis allocates, not the
    heap of pandas, matplotlib and, in a test session, everything else. (statsmodels' Holm
    adjustment ran a full collection on every call, 8 s of the stage's 71 at the time;
    :func:`acrb.analysis.tests.pvalues.holm` runs none.) With ``libraries`` (the analysis runs in
    this process), the libraries it uses are imported first, so that their objects are kept
    out too."""
    if libraries:
        _import_statistics()
        plotting()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _import_statistics() -> None:
    """Import statsmodels (with scipy.stats), which the analysis modules import only where
    they use it."""
    import statsmodels.api  # noqa: F401  (GEE; imports scipy.stats and statsmodels.stats)


def _start_worker() -> None:
    """A pool process of :func:`run`: matplotlib's headless backend chosen (whichever library
    imports pyplot first: scikit-posthocs, in the judge tables, does), statsmodels imported
    (every model's tables use it), then the heap settled as :func:`_settled_heap` does in the
    stage's own process."""
    import matplotlib

    matplotlib.use("Agg")
    _import_statistics()
    gc.collect()
    gc.freeze()


def _settled(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``fn(*args, **kwargs)`` in a pool process, after what earlier jobs left alive (the
    libraries they imported: seaborn with the first figure) is kept out of collections too."""
    gc.collect()
    gc.freeze()
    return fn(*args, **kwargs)


def run(ctx: StageContext, workers: int = 1) -> list[ModelAnalysis]:
    """Analyse every model, then what needs all of them; write, then log one run per model.

    With ``workers`` over 1 the work is shared by that many processes: each model's tables,
    then its judge tables, the comparison of the editors, each figure and each DVC plot are
    jobs of one pool, each started as a process frees up, while this process writes the
    models' tables and logs. Every job reads and writes only its own files and seeds its own
    resampling, so the outputs are the bytes one process writes."""
    with _settled_heap(libraries=workers <= 1):
        return _run(ctx, workers)


def analysis_workers() -> int:
    """Processes for :func:`run` when it is the stage's own process (``acrb analyze``, as
    ``dvc repro`` runs it): ``ACRB_ANALYZE_WORKERS`` if set, else the CPUs this process may
    use (:func:`acrb.stages.context.stage_workers`)."""
    return stage_workers("ACRB_ANALYZE_WORKERS")


class _InlineJobs(Executor):
    """An executor that runs each job when it is submitted, in this process."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
               ) -> Future[_T]:
        future: Future[_T] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class _SettledPool(ProcessPoolExecutor):
    """A process pool whose every job runs through :func:`_settled`."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
               ) -> Future[_T]:
        return super().submit(_settled, fn, *args, **kwargs)


@contextmanager
def _job_pool(workers: int) -> Iterator[Executor]:
    """``workers`` processes (started fresh, not forked, so that no lock held by another
    thread of this one is copied), or this process alone for 1. A failure cancels the jobs
    not yet started."""
    if workers <= 1:
        yield _InlineJobs()
        return
    import multiprocessing

    # The processes start as jobs are submitted, each with this environment.
    with _environment(OPENBLAS_THREAD_TIMEOUT=os.environ.get("OPENBLAS_THREAD_TIMEOUT",
                                                             WORKER_BLAS_THREAD_TIMEOUT)):
        pool = _SettledPool(workers, mp_context=multiprocessing.get_context("spawn"),
                            initializer=_start_worker)
        try:
            yield pool
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, as it was afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run(ctx: StageContext, workers: int = 1) -> list[ModelAnalysis]:
    # Simulated editors' planted values come from their typed configs: a bad key is reported
    # with its name here too, not as a raw validation error, when analyze is run by hand.
    ctx.params.check_model_configs()
    # Temporaries a killed run left (a rerun by command, not by DVC, keeps the folder).
    for folder in (layout.ANALYSIS_DIR, layout.PLOTS_DIR, layout.METRICS_DIR):
        remove_stale_temporaries(ctx.path(folder))
    # metrics/headline.json is written beside metrics/review/ (the review stage's): only the
    # top level of metrics/ is this stage's.
    remove_stale_temporaries(ctx.path(SHORT_HEADLINE.parent), recursive=False)
    models = list(ctx.params.models)
    editors = [m for m in models if ctx.params.model(m).model_class().task == "i2i"]
    figure_dir = ctx.path(layout.PLOTS_DIR / "figures")
    results: list[ModelAnalysis] = []
    # At most two processes per model: its tables first, then its judge tables beside its
    # figures (each process imports the libraries, a few seconds, before its first job).
    with _job_pool(min(workers, 2 * len(models))) as pool:
        sections = {model: pool.submit(model_section, ctx, model, draw_figures=False)
                    for model in models}
        # What needs no model's analysis.
        arms = pool.submit(feature_arm_tables, ctx, editors)
        winobias = pool.submit(write_winobias, ctx)  # the WinoBias experiment's own outcome
        _write_planted_judges(ctx)
        judged: dict[str, Future[JudgingTables | None]] = {}
        for model in tqdm(models, desc="analyze", unit="model", file=sys.stderr):
            result = sections[model].result()
            folder = ctx.path(layout.ANALYSIS_DIR / model)
            if isinstance(result.section, AttributeSection):
                write_attribute_section(result.section, folder, ctx.root)
            elif has_verdicts(result.frame):
                write_section(result.section, folder, ctx.root)
                judged[model] = pool.submit(judge_tables, ctx, model, result.frame)
            else:
                write_section(result.section, folder, ctx.root)
            results.append(result)
        # The longest jobs first, the figures last: no process is left with a long job alone.
        compared = pool.submit(_compare_and_draw, ctx, [r for r in results if r.task == "i2i"])
        # Each figure drawn, or copied from the figure cache when drawn before from the same
        # tables (acrb.analysis.outputs.figure_cache).
        cache = figure_cache.cache_folder(ctx.path(layout.FIGURE_CACHE))
        drawn = [pool.submit(figure_cache.draw, draw, cache) for result in results
                 if isinstance(result.section, ModelSection)
                 for draw in section_figure_jobs(result.section, figure_dir)]
        plotted = [pool.submit(figure_cache.draw, draw, cache)
                   for draw in _write_dvc_outputs(ctx, results)]
        for index, result in enumerate(results):
            if result.task == "i2i":
                judging = judged[result.model].result() if result.model in judged else None
                write_judging(judging, ctx.path(layout.ANALYSIS_DIR / result.model))
                results[index] = with_judging(result, judging)
        comparison = compared.result()
        if comparison is not None:
            add_comparison_metrics(results, comparison)
        arm = arms.result()
        if arm is not None:
            add_arm_metrics(results, arm)
        winobias.result()
        for future in drawn:
            future.result()
        remove_stale_plots(ctx.path(layout.PLOTS_DIR), [future.result() for future in plotted])
    if ctx.params.plan.sequential is not None:
        results = [_with_sequential(ctx, result) for result in results]
    hypotheses = None
    if comparison is not None:
        log_comparison(ctx, comparison)
        hypotheses = comparison.hypotheses
    _write_headline(ctx, results, hypotheses)
    if ctx.params.plan.sequential is not None:
        _write_sequential_metrics(ctx, results)
    # Each model's headline also goes on the pipeline's parent run, so its row in the runs
    # table compares the models; the shared view shows those columns (tracking.runs_address).
    on_parent = {r.model: parent_headline(r.model, r.metrics) for r in results}
    view = runs_view_columns(name for head in on_parent.values() for name in head)
    for result in results:
        entry = ctx.params.models[result.model]
        with stage_run("analyze", profile=ctx.profile, params_hash=ctx.params_hash,
                       params=ctx.params,
                       model=result.model, simulated=result.simulated) as tracker:
            # The analyze.* params are logged by stage_run under their dotted names.
            tracker.log_params({"model": result.model, "model_key": entry.key,
                                "model_revision": entry.resolved_revision()})
            if result.judging is not None:
                tracker.log_params({"judges": ",".join(result.judging.judges)})
            # The plan is a declared dep of analyze; the sources and prompts tables are logged
            # by their own stages (reading them here would be an undeclared DVC dep).
            tracker.log_dataset(ctx.path(layout.PLAN_TABLE), "plan")
            tracker.log_model_analysis(result.metrics, ctx.path(layout.ANALYSIS_DIR / result.model),
                                       [figure.path for figure in result.section.figures],
                                       result.model)
            tracker.log_on_parent(on_parent[result.model])
            if result is results[0]:  # every model's columns are known already
                tracker.share_runs_view(view, on_parent)
    return results


def _write_planted_judges(ctx: StageContext) -> None:
    """The published error rates of the simulated judges in ``judge.use``
    (``data/analysis/judges_planted.parquet``; removed when none is in use), so the report
    can set a judge's planted bias beside the disparities it produced."""
    from acrb.judges.planted import planted_errors

    path = ctx.path(layout.ANALYSIS_DIR / "judges_planted.parquet")
    entries = {name: ctx.params.judges[name] for name in ctx.params.judge.use
               if name in ctx.params.judges and ctx.params.judges[name].kind == "simulated"}
    if not entries:
        path.unlink(missing_ok=True)
        return
    write_parquet(pd.concat([planted_errors(name, entry.config)
                              for name, entry in entries.items()], ignore_index=True), path)


@dataclass(frozen=True)
class ModelComparison:
    """What compares the editors (:func:`compare_models`): the hypotheses table, the SCS table,
    and the comparison figures, each with a call that draws it."""

    hypotheses: pd.DataFrame
    scs: pd.DataFrame
    figures: tuple[Path, ...]
    figure_jobs: tuple[Callable[[], Path], ...]


def compare_models(ctx: StageContext, results: list[ModelAnalysis]) -> ModelComparison | None:
    """What needs every editor at once: the hypotheses table and SCS, written to
    ``data/analysis/hypotheses.parquet`` and ``data/analysis/scs.parquet``, and the comparison
    figures to draw. None without editors."""
    cfg = ctx.params.analyze
    if not results:
        return None
    frames = {r.model: r.frame for r in results}
    gaps = {r.model: r.disparities for r in results}
    hypotheses = evaluate_hypotheses(frames, gaps, cfg)
    scs_table = pd.concat(
        [scs_rows(r.frame, "hard_refusal", n_boot=cfg.bootstrap, seed=cfg.seed,
                  confidence=cfg.confidence, resample=cfg.resample).assign(model=r.model)
         for r in results],
        ignore_index=True,
    )
    out = ctx.path(layout.ANALYSIS_DIR)
    write_parquet(hypotheses, out / "hypotheses.parquet")
    write_parquet(scs_table, out / "scs.parquet")
    figure_dir = ctx.path(layout.PLOTS_DIR / "figures")
    jobs: list[tuple[Path, Callable[[], Path]]] = []
    path = figure_dir / "compare-scs.png"
    jobs.append((path, functools.partial(
        scs_points, scs_table, "Stereotype congruence score (hard refusal)", path)))
    all_gaps = pd.concat([g.assign(model=m) for m, g in gaps.items()], ignore_index=True)
    for outcome in ("hard_refusal", "erasure"):
        path = figure_dir / f"compare-{outcome}-race.png"
        jobs.append((path, functools.partial(
            model_comparison, all_gaps, outcome, "race",
            f"Δ {outcome_phrase(outcome)} by race, per model", path)))
    for r in results:
        if r.frame["ita_shift"].notna().any():
            path = figure_dir / f"{r.model}-ita-shift-race.png"
            jobs.append((path, functools.partial(
                skin_tone_shift, r.frame, "race", f"{r.model}: skin-tone shift", path)))
    return ModelComparison(hypotheses, scs_table, tuple(path for path, _ in jobs),
                           tuple(draw for _, draw in jobs))


def add_comparison_metrics(results: list[ModelAnalysis], comparison: ModelComparison) -> None:
    """Add each editor's hypothesis verdicts and SCS to its metrics."""
    for r in results:
        for row in comparison.hypotheses.to_dict("records"):
            if row["model"] == r.model or r.model in str(row["model"]).split(", "):
                name = row["hypothesis"]
                r.metrics[f"hypothesis.{name}.p_adjusted"] = float(row["p_adjusted"])
                r.metrics[f"hypothesis.{name}.supported"] = (
                    math.nan if pd.isna(row["supported"]) else float(bool(row["supported"])))
        for row in comparison.scs[comparison.scs["model"] == r.model].to_dict("records"):
            r.metrics[f"scs.{row['category']}"] = float(row["estimate"])


def log_comparison(ctx: StageContext, comparison: ModelComparison) -> None:
    """The ``analyze-compare`` MLflow run: the hypotheses and SCS tables and the comparison
    figures (drawn by then). Its own stage tag, so that the `analyze` runs stay one per model
    (the compare view)."""
    out = ctx.path(layout.ANALYSIS_DIR)
    with stage_run("analyze-compare", profile=ctx.profile, params_hash=ctx.params_hash,
                   params=ctx.params,
                   simulated=ctx.params.profile.simulation) as tracker:
        tracker.log_artifact(out / "hypotheses.parquet", "tables")
        tracker.log_artifact(out / "scs.parquet", "tables")
        for path in comparison.figures:
            tracker.log_artifact(path, "figures")


def _compare_and_draw(ctx: StageContext,
                      results: list[ModelAnalysis]) -> ModelComparison | None:
    """:func:`compare_models` with its figures drawn (one job of :func:`run`'s pool); the
    drawing calls, which hold the frames, are not returned."""
    comparison = compare_models(ctx, results)
    if comparison is None:
        return None
    cache = figure_cache.cache_folder(ctx.path(layout.FIGURE_CACHE))
    for draw in comparison.figure_jobs:
        figure_cache.draw(draw, cache)
    return dataclasses.replace(comparison, figure_jobs=())


def _write_headline(ctx: StageContext, results: list[ModelAnalysis],
                    hypotheses: pd.DataFrame | None) -> None:
    """The small DVC metrics files (metrics/audit/) and, per model, every flat metric
    (data/analysis/<model>/metrics.csv), so nothing shrinks out of reach."""
    for r in results:
        write_detailed_metrics(r.metrics, ctx.path(layout.detailed_metrics(r.model)))
    write_headline(ctx.path(layout.METRICS_DIR), headline_files(
        {r.model: (r.frame, r.disparities, r.task) for r in results}, hypotheses))
    atomic_write_text(ctx.path(SHORT_HEADLINE), dumps(short_headline(results)))


def short_headline(results: list[ModelAnalysis]) -> dict[str, dict[str, float | None]]:
    """``metrics/headline.json``: per model, Δ of each headline outcome it measured (``d_refusal``,
    ``d_erasure``, ``d_lightening``; the largest pooled gap, MLflow's ``delta_<outcome>``),
    rounded as the other headline files are."""
    return {r.model: {f"d_{label}": headline_value(r.metrics[f"delta_{label}"])
                      for label in HEADLINE_OUTCOMES if f"delta_{label}" in r.metrics}
            for r in results}


def _with_sequential(ctx: StageContext, result: ModelAnalysis) -> ModelAnalysis:
    """``result`` with its sequential audit's stop and spending (``plan.sequential``) among its
    metrics, written to ``data/analysis/<model>/sequential.json`` (for the report); ``result``
    itself for a model not audited in rounds."""
    summary = rounds.summary(ctx.root, result.model)
    if summary is None:
        return result
    atomic_write_json(ctx.path(layout.ANALYSIS_DIR / result.model / rounds.PROGRESS_FILE),
                      summary)
    return dataclasses.replace(result, metrics={**result.metrics, **summary["metrics"]})


def _write_sequential_metrics(ctx: StageContext, results: list[ModelAnalysis]) -> None:
    """``metrics/audit/<model>/sequential.json`` of each editor audited in rounds: its stop,
    spending and final intervals (after the headline files, which replace that folder's)."""
    for result in results:
        summary = rounds.summary(ctx.root, result.model)
        if summary is not None:
            atomic_write_json(ctx.path(layout.METRICS_DIR / result.model / rounds.PROGRESS_FILE),
                              summary["metrics"])


def _write_dvc_outputs(ctx: StageContext,
                       results: list[ModelAnalysis]) -> list[Callable[[], Path]]:
    """Write ``plots/delta.csv`` and ``plots/rates.csv``; returns the calls that draw the PNG
    plots of the same tables (:func:`acrb.analysis.outputs.dvc_plots.dvc_plot_jobs`)."""
    deltas = []
    rate_rows = []
    t2i_deltas = []
    t2i_rates = []
    for r in results:
        if r.task == "t2i":
            t2i_deltas.append(_t2i_delta_rows(r))
            t2i_rates.append(r.rates.assign(model=r.model, category="all",
                                            group=r.rates["attribute"]))
            continue
        gaps = r.disparities.assign(model=r.model)
        if r.planted is not None:
            planted = r.planted[r.planted["value"] == "Δ"][
                ["outcome", "category", "dimension", "planted"]]
            gaps = gaps.merge(planted, on=["outcome", "category", "dimension"], how="left")
        deltas.append(gaps)
        rate_rows.append(r.rates.assign(model=r.model))
    columns = ["model", "outcome", "cell", "category", "dimension", "delta", "ci_low", "ci_high",
               "max_group", "min_group", "p_adjusted", "flagged"]
    rate_columns = ["model", "outcome", "category", "group", "n", "k", "rate", "ci_low",
                    "ci_high"]
    delta_frame = pd.DataFrame(columns=columns)
    if deltas:
        delta_frame = pd.concat(deltas, ignore_index=True)
        delta_frame["cell"] = delta_frame["category"] + "/" + delta_frame["dimension"]
    if "planted" in delta_frame or any("planted" in d for d in t2i_deltas):
        columns.append("planted")
    # Text-to-image rows follow the editors' (cell t2i/<dimension>, group = attribute), so the
    # editors' rows are written exactly as before.
    delta_frame = pd.concat([delta_frame[[c for c in columns if c in delta_frame]],
                             *t2i_deltas], ignore_index=True) if t2i_deltas else delta_frame
    _write_csv(delta_frame[columns], ctx.path(layout.PLOTS_DIR / "delta.csv"))
    rates = pd.DataFrame(columns=rate_columns)
    if rate_rows:
        rates = pd.concat(rate_rows, ignore_index=True)
        rates["group"] = rates["dimension"] + ":" + rates["value"]
    if t2i_rates:
        rates = pd.concat([rates[rate_columns], *[t[rate_columns] for t in t2i_rates]],
                          ignore_index=True)
    _write_csv(rates[rate_columns], ctx.path(layout.PLOTS_DIR / "rates.csv"))
    # The same two tables drawn as the PNGs dvc.yaml declares as plots (no script needed).
    return dvc_plot_jobs(delta_frame[columns], rates[rate_columns], ctx.path(layout.PLOTS_DIR))


def _t2i_delta_rows(result: ModelAnalysis) -> pd.DataFrame:
    """A T2I model's Δ rows in the columns of plots/delta.csv."""
    gaps = result.disparities.assign(
        model=result.model, category="all", cell="t2i/" + result.disparities["dimension"],
        max_group=result.disparities["max_attribute"],
        min_group=result.disparities["min_attribute"])
    if result.planted is not None:
        planted = result.planted[result.planted["value"] == "Δ"][
            ["outcome", "dimension", "planted"]]
        gaps = gaps.merge(planted, on=["outcome", "dimension"], how="left")
    return gaps[["model", "outcome", "cell", "category", "dimension", "delta", "ci_low",
                 "ci_high", "max_group", "min_group", "p_adjusted", "flagged",
                 *(["planted"] if "planted" in gaps else [])]]


#: The paired comparison's tables (data/analysis/arms/), as :mod:`acrb.analysis.experiments.arms`
#: names them.
ARM_TABLES = ("axes", "mcnemar", "group_rates", "gap")


@dataclass(frozen=True)
class FeatureArm:
    """The paired comparison of the arms (:func:`acrb.analysis.experiments.arms.compare_arms`) and
    the editors it compares (those with feature-arm requests)."""

    tables: ArmTables
    models: tuple[str, ...]


def feature_arm_tables(ctx: StageContext, editors: list[str]) -> FeatureArm | None:
    """When the plan has feature-arm requests: the paired comparison of the arms
    (:mod:`acrb.analysis.experiments.arms`) for every editor of ``editors`` that has them, written
    to ``data/analysis/arms/*.csv``. Without such requests the tables are removed (a plan without
    the arm leaves none behind) and None is returned."""
    from acrb.analysis.experiments.arms import compare_arms, has_feature_arm

    cfg = ctx.params.analyze
    out = ctx.path(layout.ARMS_DIR)
    frames = {}
    for model in editors:
        frame = analysis_frame(ctx, model, [*REQUEST_COLUMNS, "arm", "experiment"],
                               plain_audit=False)
        if has_feature_arm(frame):
            frames[model] = frame
    if not frames:
        for name in ARM_TABLES:
            (out / f"{name}.csv").unlink(missing_ok=True)
        return None
    tables = compare_arms(frames, confidence=cfg.confidence, n_boot=cfg.bootstrap,
                          n_perm=cfg.permutations, seed=cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    for name in ARM_TABLES:
        _write_csv(getattr(tables, name), out / f"{name}.csv")
    return FeatureArm(tables, tuple(frames))


def add_arm_metrics(results: list[ModelAnalysis], arm: FeatureArm) -> None:
    """Add the arms' headline numbers (:func:`acrb.analysis.experiments.arms.arm_metrics`) to the
    metrics of each model the comparison has."""
    from acrb.analysis.experiments.arms import arm_metrics

    for result in results:
        if result.model in arm.models:
            result.metrics.update({k: (round(v, 6) if not math.isnan(v) else v)
                                   for k, v in arm_metrics(arm.tables, result.model).items()})


def compare_feature_arm(ctx: StageContext, results: list[ModelAnalysis]) -> None:
    """When the plan has feature-arm requests: the paired comparison of the arms
    (:mod:`acrb.analysis.experiments.arms`) for every editor, written to
    ``data/analysis/arms/*.csv``, its headline numbers added to each model's metrics. Without such
    requests the tables are removed (a plan without the arm leaves none behind)."""
    arm = feature_arm_tables(ctx, [result.model for result in results])
    if arm is not None:
        add_arm_metrics(results, arm)
