"""Stage `tables`: the paper's tables as CSV and booktabs LaTeX, each naming its run and inputs.

Runs after ``analyze`` and ``review``. Tables 1-4 and 9 are computed from the image editors'
analysis frames (plain-arm audit requests with the judges' ensemble verdicts,
:func:`acrb.analysis.inputs.analysis_frame`) and table 8 from the same frames with the feature arm,
with the ``analyze`` stage's interval settings (params ``analyze``) and the outcome rules of params
``judge.outcomes`` (named in the definitions); tables 5-7 are read from ``data/analysis/arms/``,
``data/analysis/winobias/`` and ``data/review/analysis/``
(:mod:`acrb.analysis.outputs.paper_tables`). Table 7's per-model means are recomputed from the
ratings and items the review stage wrote there, under the consensus rule its ``review.json`` names,
and checked against its ``judge_human`` table; when they do not reproduce it, the means are left out
and the index says why. A table whose inputs do not exist (no judges, no feature arm in the plan, no
WinoBias requests, no review) is skipped, with the reason in the index.

Writes ``data/tables/<id>.csv`` and ``<id>.tex`` per table and ``data/tables/index.json``:
per table its number, title, files, status (written or skipped, and why) and provenance: the
profile, whether it is a simulation, the params hash, the git commit, and the sha256 of every
input file with their combined digest (the LaTeX footnote and the HTML caption carry the first
12 hex digits of each). sha256 of the files' bytes rather than DVC's md5 so that the record
does not depend on DVC being installed or on how DVC hashes a folder; each file is listed, so a
reader can check any one of them. Logs one MLflow run with the folder as artifacts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from acrb import __version__, layout
from acrb.analysis.agreement import raters
from acrb.analysis.inputs import FEATURE_ARM, REQUEST_COLUMNS, analysis_frame, read_verdicts
from acrb.analysis.outputs import paper_tables
from acrb.analysis.outputs.paper_tables import SPECS, Provenance, Resampling, latex_table
from acrb.config import ConsensusRule
from acrb.records import RatingRecord, ReviewItemRecord, VerdictRecord, read_table
from acrb.stages.context import StageContext
from acrb.storage import (
    atomic_write_json,
    atomic_write_text,
    read_csv,
    remove_stale_temporaries,
    sha256_file,
    write_csv,
)
from acrb.tracking import stage_run

INDEX_FILE = layout.TABLES_DIR / "index.json"


@dataclass(frozen=True)
class TableResult:
    """One table of the run: its id, the frame written (None when skipped), why it was
    skipped, and its provenance."""

    id: str
    frame: pd.DataFrame | None
    note: str
    provenance: Provenance

    @property
    def written(self) -> bool:
        return self.frame is not None


def _hashes(ctx: StageContext, paths: list[Path]) -> dict[str, str]:
    """Project-relative path -> sha256 of each existing file in ``paths``."""
    return {str(p): sha256_file(ctx.path(p)) for p in sorted(set(paths)) if ctx.path(p).is_file()}


def simulated_models(ctx: StageContext) -> list[str]:
    """The models whose ``analyze`` section says they are simulated (read from the analysis,
    so that a paper profile run with simulated adapters swapped in by ``-S`` is marked as a
    simulation even when its profile is not)."""
    found = []
    for model in ctx.params.models:
        index = ctx.path(layout.ANALYSIS_DIR / model / "section.json")
        if index.is_file() and json.loads(index.read_text()).get("simulated"):
            found.append(model)
    return found


def _edited_models(ctx: StageContext) -> dict[str, pd.DataFrame]:
    """Each image editor with verdicts -> its analysis frame (plain-arm audit requests)."""
    plan = pd.read_parquet(ctx.path(layout.PLAN_TABLE), columns=["model", "mode"])
    editors = set(plan.loc[plan["mode"] == "i2i", "model"])
    return {model: analysis_frame(ctx, model) for model in ctx.params.models
            if model in editors and read_verdicts(ctx, model) is not None}


def _feature_frames(ctx: StageContext, models: list[str]) -> dict[str, pd.DataFrame]:
    """Each of ``models`` whose plan has feature-arm requests -> its analysis frame of every
    arm of the audit (with ``arm`` and ``experiment``), for table 8."""
    plan = pd.read_parquet(ctx.path(layout.PLAN_TABLE), columns=["model", "arm"])
    with_arm = set(plan.loc[plan["arm"] == FEATURE_ARM, "model"])
    return {model: analysis_frame(ctx, model, [*REQUEST_COLUMNS, "arm", "experiment"],
                                  plain_audit=False)
            for model in models if model in with_arm}


#: The consensus rules a review stage may have used (params ``review.consensus``).
CONSENSUS_RULES: tuple[ConsensusRule, ...] = ("median", "mean")


def judge_human_means(ctx: StageContext, agreement_rows: pd.DataFrame
                      ) -> tuple[pd.DataFrame | None, str, str, list[Path]]:
    """Table 7's per-model means: (means or None, the consensus rule, a note, the inputs read).

    Recomputed from the review stage's ratings and items (``data/review/analysis/``) and the
    judges' verdicts, on the units the review stage compares (the random sample's edited
    outputs), under the rule its ``review.json`` names (key ``consensus``), checked against the
    review's ``judge_human`` table (:func:`acrb.analysis.outputs.paper_tables.means_reproduce`). A
    review.json that names no rule, or means that do not reproduce that table, give None, with
    the reason in the note: never means under a rule the review did not use."""
    folder = layout.REVIEW_ANALYSIS_DIR
    ratings_path, items_path, info_path = (folder / "ratings.parquet", folder / "items.parquet",
                                           folder / "review.json")
    info = (json.loads(ctx.path(info_path).read_text()) if ctx.path(info_path).is_file()
            else {})
    stated = info.get("consensus")
    if not (ctx.path(ratings_path).is_file() and ctx.path(items_path).is_file()):
        return None, str(stated or ""), (f"people's per-model means left out: {folder} holds "
                                         "no ratings.parquet and items.parquet"), []
    ratings = read_table(ctx.path(ratings_path), RatingRecord)
    items = read_table(ctx.path(items_path), ReviewItemRecord)
    models = sorted(set(items["model"].astype(str)))
    paths = [ratings_path, items_path, info_path,
             *[layout.verdicts_table(m) for m in models
               if ctx.path(layout.verdicts_table(m)).is_file()]]
    # The axes the review stage compared (ACRB's, and the study's bipolar age item where
    # people were asked it), in the ratings' order.
    axes = [a for a in raters.rated_axes(ratings) if a in set(agreement_rows["axis"])]
    verdicts = [read_table(ctx.path(layout.verdicts_table(m)), VerdictRecord)
                [["request_id", *axes]] for m in models
                if ctx.path(layout.verdicts_table(m)).is_file()]
    judged = (pd.concat(verdicts, ignore_index=True) if verdicts
              else pd.DataFrame(columns=["request_id", *axes]))
    if stated not in CONSENSUS_RULES:
        return None, "", (f"people's per-model means left out: {info_path} does not name the "
                          "consensus rule its tables used (rerun `acrb review`)"), paths
    units = raters.judge_human_units(ratings, items, judged, axes, consensus_rule=stated)
    units = units[units["random_sample"].astype(bool)
                  & (units["output"] == "edited")].reset_index(drop=True)
    means = paper_tables.judge_human_means(units, axes)
    if paper_tables.means_reproduce(agreement_rows, means):
        return means, stated, "", paths
    return None, stated, (
        f"people's per-model means left out: recomputed from {folder} under the {stated} its "
        "review.json names, they do not reproduce the review stage's judge_human table (rerun "
        "`acrb review`)"), paths


def _frame_inputs(models: list[str]) -> list[Path]:
    return [layout.PLAN_TABLE, *[layout.judgements_table(m) for m in models],
            *[layout.verdicts_table(m) for m in models]]


def _read_csv(path: Path) -> pd.DataFrame:
    return read_csv(path, keep_default_na=True)


def build_tables(ctx: StageContext) -> list[TableResult]:
    """Compute or read every table of :data:`acrb.analysis.outputs.paper_tables.TABLES`."""
    cfg = ctx.params.analyze
    settings = Resampling(confidence=cfg.confidence, n_boot=cfg.bootstrap,
                          n_perm=cfg.permutations, seed=cfg.seed, resample=cfg.resample,
                          simultaneous=cfg.simultaneous_intervals, test=cfg.test)
    simulated = ctx.params.profile.simulation or bool(simulated_models(ctx))
    frames = _edited_models(ctx)
    frame_inputs = _frame_inputs(list(frames))
    rules = ctx.params.judge.outcomes
    race_change = paper_tables.race_change_outcomes(rules)
    arms = layout.ARMS_DIR
    wino = layout.WINOBIAS_DIR
    review = layout.REVIEW_ANALYSIS_DIR

    def computed(build: Callable[[], pd.DataFrame]) -> tuple[pd.DataFrame | None, str,
                                                              list[Path]]:
        if not frames:
            return None, ("no image editor has judge verdicts (params judge.use is empty or "
                          "the judge stage has not run)"), []
        return build(), "", frame_inputs

    def feature() -> tuple[pd.DataFrame | None, str, list[Path]]:
        paths = [arms / "group_rates.csv", arms / "gap.csv"]
        if not all(ctx.path(p).is_file() for p in paths):
            return None, ("the plan has no feature arm (plan.arms lacks `feature`), so "
                          f"{arms} holds no group_rates.csv and gap.csv"), []
        return (paper_tables.feature_mitigation(_read_csv(ctx.path(paths[0])),
                                                _read_csv(ctx.path(paths[1]))), "", paths)

    def winobias() -> tuple[pd.DataFrame | None, str, list[Path]]:
        rates, skipped = wino / "rates.csv", wino / "skipped.csv"
        if not ctx.path(rates).is_file():
            return None, (f"the plan has no WinoBias requests, so {rates} does not exist"), []
        skipped_frame = _read_csv(ctx.path(skipped)) if ctx.path(skipped).is_file() else None
        return (paper_tables.winobias(_read_csv(ctx.path(rates)), skipped_frame), "",
                [rates, skipped])

    def feature_scores() -> tuple[pd.DataFrame | None, str, list[Path]]:
        if not frames:
            return computed(lambda: pd.DataFrame())
        with_arm = _feature_frames(ctx, list(frames))
        if not with_arm:
            return None, ("the plan has no feature arm (plan.arms lacks `feature`), so there "
                          "are no pairs to compare"), []
        return (paper_tables.feature_scores(with_arm, settings), "",
                _frame_inputs(list(with_arm)))

    def judge_human() -> tuple[pd.DataFrame | None, str, list[Path]]:
        rows, agree = review / "judge_human.parquet", review / "agreement.parquet"
        if not ctx.path(rows).is_file():
            return None, (f"the review stage has not run, so {rows} does not exist"), []
        rater = pd.read_parquet(ctx.path(agree)) if ctx.path(agree).is_file() else None
        agreement_rows = pd.read_parquet(ctx.path(rows))
        means, rule, note, paths = judge_human_means(ctx, agreement_rows)
        return (paper_tables.judge_human(agreement_rows, rater, means, rule), note,
                [rows, agree, *paths])

    builders: dict[str, Callable[[], tuple[pd.DataFrame | None, str, list[Path]]]] = {
        "judge_means": lambda: computed(lambda: paper_tables.judge_means(frames, settings)),
        "race_rates": lambda: computed(lambda: paper_tables.race_rates(
            frames, settings, ("judge_lightening", *race_change), rules)),
        "model_summary": lambda: computed(lambda: paper_tables.model_summary(
            frames, settings, paper_tables.summary_measures(rules), rules)),
        "race_gap": lambda: computed(lambda: paper_tables.race_gap(
            frames, settings, race_change, rules)),
        "feature_mitigation": feature,
        "winobias": winobias,
        "judge_human": judge_human,
        "feature_scores": feature_scores,
        "white_vs_nonwhite": lambda: computed(
            lambda: paper_tables.white_vs_nonwhite(frames)),
    }
    results = []
    for spec in tqdm(paper_tables.TABLES, desc="tables", unit="table", file=sys.stderr):
        frame, note, paths = builders[spec.id]()
        provenance = Provenance(ctx.profile, ctx.params_hash, simulated, __version__,
                                _hashes(ctx, paths))
        results.append(TableResult(spec.id, frame, note, provenance))
    return results


def write_tables(ctx: StageContext, results: list[TableResult]) -> Path:
    """Write each table's CSV and LaTeX (removing those of a skipped table) and the index."""
    out = ctx.path(layout.TABLES_DIR)
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for result in results:
        spec = SPECS[result.id]
        csv_path, tex_path = out / f"{spec.id}.csv", out / f"{spec.id}.tex"
        entry: dict[str, Any] = {"number": spec.number, "id": spec.id, "title": spec.title,
                                 "status": "written" if result.written else "skipped",
                                 "note": result.note}
        if result.frame is None:
            csv_path.unlink(missing_ok=True)
            tex_path.unlink(missing_ok=True)
        else:
            write_csv(result.frame, csv_path, float_format="%.6g")
            atomic_write_text(tex_path, latex_table(spec, result.frame, result.provenance))
            entry.update(files={"csv": str(layout.TABLES_DIR / csv_path.name),
                                "tex": str(layout.TABLES_DIR / tex_path.name)},
                         rows=len(result.frame), columns=list(result.frame.columns))
        p = result.provenance
        entry["provenance"] = {"profile": p.profile, "simulated": p.simulated,
                               "params_hash": p.params_hash, "acrb_version": p.acrb_version,
                               "inputs": p.inputs, "inputs_sha256": p.inputs_digest,
                               "footer": p.footer()}
        entries.append(entry)
    first = results[0].provenance if results else None
    atomic_write_json(ctx.path(INDEX_FILE), {
        "profile": ctx.profile, "params_hash": ctx.params_hash,
        "simulated": bool(first and first.simulated),
        "simulated_models": simulated_models(ctx),
        "acrb_version": __version__,
        "tables": entries,
    })
    return out


def run(ctx: StageContext) -> list[TableResult]:
    """Build, write and log the paper's tables; returns them (skipped ones with their note)."""
    # Temporaries a killed run left (a rerun by command, not by DVC, keeps the folder).
    remove_stale_temporaries(ctx.path(layout.TABLES_DIR))
    results = build_tables(ctx)
    out = write_tables(ctx, results)
    simulated = any(r.provenance.simulated for r in results)
    with stage_run("tables", profile=ctx.profile, params_hash=ctx.params_hash, params=ctx.params,
                   simulated=simulated) as tracker:
        tracker.log_params({"tables.written": ",".join(r.id for r in results if r.written),
                            "tables.skipped": ",".join(r.id for r in results
                                                       if not r.written)})
        tracker.log_artifact(out, "tables")
    return results
