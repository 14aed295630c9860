"""Where each stage writes, relative to the project root (the folder holding dvc.yaml)."""

from __future__ import annotations

from pathlib import Path

SOURCES_DIR = Path("data/sources")
SOURCES_TABLE = SOURCES_DIR / "sources.parquet"
SOURCE_IMAGES = SOURCES_DIR / "images"
#: The face located in each source portrait, by its pixels (acrb.detect.face.faces_entry), so
#: that later stages do not search every portrait again.
SOURCE_FACES = SOURCES_DIR / "faces.json"
SOURCE_CANDIDATES = SOURCES_DIR / "candidates"
#: The candidates' pre-screen measurements by image sha256 (acrb.sources.prescreen), kept
#: outside the stage's outputs so that a rerun measures only new images.
PRESCREEN_CACHE = Path(".acrb-cache/prescreen")
#: Figures analyze drew, kept by their inputs (acrb.analysis.outputs.figure_cache).
FIGURE_CACHE = Path(".acrb-cache/figures")
PROMPTS_DIR = Path("data/prompts")
PROMPTS_TABLE = PROMPTS_DIR / "prompts.parquet"
#: Feature prompts p_feat per source portrait (the ``features`` stage).
FEATURES_DIR = Path("data/features")
FEATURES_TABLE = FEATURES_DIR / "features.parquet"
#: The study's published files as the user imported them (prompt set, feature mapping, WinoBias).
STUDY_INPUTS = Path("inputs/study")
PLAN_DIR = Path("data/plan")
PLAN_TABLE = PLAN_DIR / "requests.parquet"
#: Request counts and estimated GPU-hours per model.
PLAN_SUMMARY = PLAN_DIR / "summary.json"
#: A sequential audit's stopping rule (:meth:`acrb.config.Params.stopping_rule`): null if fixed.
PLAN_STOPPING = PLAN_DIR / "stopping.json"
GENERATIONS_DIR = Path("data/generations")
JUDGEMENTS_DIR = Path("data/judgements")
SCORES_DIR = Path("data/scores")
ANALYSIS_DIR = Path("data/analysis")
#: The paired comparison of the feature arm with the plain arm (``analyze``).
ARMS_DIR = ANALYSIS_DIR / "arms"
#: The WinoBias experiment's stereotype-following rates (``analyze``).
WINOBIAS_DIR = ANALYSIS_DIR / "winobias"
#: The paper's tables as CSV and booktabs LaTeX, each naming its run and params.
TABLES_DIR = Path("data/tables")
REVIEW_DIR = Path("data/review")
#: The versioned review set the ``review_set`` stage draws (items people rate), and its summary.
REVIEW_SET_DIR = REVIEW_DIR / "set"
REVIEW_SET = REVIEW_SET_DIR / "items.parquet"
REVIEW_SET_SUMMARY = REVIEW_SET_DIR / "summary.json"
#: The ``review`` stage's tables: agreement, judge vs human, judge-corrected rates.
REVIEW_ANALYSIS_DIR = REVIEW_DIR / "analysis"
#: The review's headline DVC metrics (corrected Δ per model and outcome, agreement per axis).
REVIEW_METRICS_DIR = Path("metrics/review")
#: The ratings ``acrb review finalize`` (or ``acrb review import-survey``) writes for DVC.
REVIEW_INPUTS = Path("inputs/review")
RATINGS_TABLE = REVIEW_INPUTS / "ratings.parquet"
REVIEW_ITEMS_TABLE = REVIEW_INPUTS / "items.parquet"
#: The headline DVC metrics (``dvc metrics show``): one small JSON file per model and outcome, and
#: one per model with request counts and hypothesis verdicts
#: (:mod:`acrb.analysis.outputs.headline`).
METRICS_DIR = Path("metrics/audit")
PLOTS_DIR = Path("plots")
REPORT_FILE = Path("reports/report.html")


def detailed_metrics(model: str) -> Path:
    """Every flat metric of one model (the headline's detail, and what MLflow receives)."""
    return ANALYSIS_DIR / model / "metrics.csv"


def generations_dir(model: str) -> Path:
    return GENERATIONS_DIR / model


def generations_table(model: str) -> Path:
    return generations_dir(model) / "generations.parquet"


def judgements_dir(model: str) -> Path:
    return JUDGEMENTS_DIR / model


def judgements_table(model: str) -> Path:
    return judgements_dir(model) / "judgements.parquet"


def scores_dir(model: str) -> Path:
    """The judge stage's folder of one model: a subfolder of records per judge, the tables."""
    return SCORES_DIR / model


def scores_table(model: str, judge: str) -> Path:
    """One judge's answers about one model's generations."""
    return scores_dir(model) / f"{judge}.parquet"


def verdicts_table(model: str) -> Path:
    """The judges' combined scores and outcomes for one model's generations."""
    return scores_dir(model) / "verdicts.parquet"
