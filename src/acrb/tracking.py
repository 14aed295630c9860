"""MLflow: the one place that knows run names, tags, the store location and artifacts.

Two roots. The *stage root* is the folder DVC runs a stage in: the nearest folder holding
``dvc.yaml`` from the working directory. For ``dvc exp run --queue``/``--run-all`` that is a
temporary copy ``<root>/.dvc/tmp/exps/tmp<random>/`` and for ``dvc exp run --temp``
``<root>/.dvc/tmp/exps/standalone/tmp<random>/`` (DVC 3.67; it also sets ``DVC_ROOT`` to the
original project, ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV``). Params, inputs and outputs
come from the stage root (:func:`stage_root`, used by ``StageContext.load``), so a queued
experiment reads its own params and writes its own outputs. The *tracking root* is where
``mlflow.db`` lives: the stage root, or for a run under ``.dvc/tmp/exps/`` the original project,
so the runs of an experiment outlive the temporary copy DVC deletes (:func:`tracking_root`).
The store is SQLite (MLflow's file store is in maintenance mode). ``MLFLOW_TRACKING_URI``
overrides the store (a team's ``mlflow server``); ``ACRB_MLFLOW=0`` turns logging off.

Layout, made for comparing. One experiment per profile (``acrb/<profile>``), created as a
classic ML experiment (tag ``mlflow.experimentKind = custom_model_development``, the tag the
MLflow 3 UI reads to choose between its model-training and GenAI pages). One *parent* run per
pipeline run, holding every param of params.yaml under its dotted name
(``analyze.confidence``, ``models.<name>.config...``) and, as inputs with digests, the datasets
the stages of this pipeline run wrote or read (the sources manifest, the prompts table and the
plan table, logged by the stage that writes each; ``analyze`` logs the plan it reads); under
it, nested with ``mlflow.parentRunId``, one run per stage (and per model for ``generate``,
``evaluate``, ``judge`` and ``analyze``) with the params of its own sections under the same
dotted names.

The stages are separate processes, so the parent is found, or created, by a key every stage of
one pipeline run computes alike (tag ``acrb.pipeline``, :func:`pipeline_key`): a hash of the git
commit, the uncommitted changes to the code (:data:`NOT_CODE`), the params hash, and
``DVC_EXP_NAME``/``DVC_EXP_BASELINE_REV`` when DVC sets them. So ``dvc repro`` after a params
change, a commit or a code edit starts a new parent; each ``dvc exp run`` (queued or not) gets
its own; and a stage re-run with nothing changed joins the parent of the run it repeats, which
is the same computation. ``ACRB_PIPELINE_RUN=<any text>`` sets the key by hand (a CI job id).

Each ``analyze`` model run logs the same short set of headline metrics
(:func:`headline_metrics`: ``delta_refusal``, ``delta_erasure``, ``delta_lightening``, their
interval bounds, flagged counts, requests) and the rest as artifacts whose names do not depend
on the model (``metrics.csv``, ``tables/*.csv``, ``tables/*.json``, ``figures/*.png``), so the
compare view of two model runs lines up metrics and artifacts. Parquet is logged as CSV, which
the UI previews. Each also logs its ``delta_<outcome>`` and ``flagged.<outcome>`` on the parent
run as ``<model>.delta_refusal`` and so on (:func:`parent_headline`), and the first stores the
experiment's shared runs view showing those Δ columns (:meth:`StageRun.share_runs_view`), the
page :func:`runs_address` (``acrb mlflow-url``) gives: one parent row compares the models.

Every run carries MLflow's own source tags (``mlflow.source.git.commit``,
``mlflow.source.name`` = ``acrb <stage>``), ``acrb.git_dirty``, the params hash, the stage and
the process that owns it (``acrb.owner_host``, ``acrb.owner_pid``, ``acrb.owner_started``). A
checkout is dirty when a tracked file differs from the commit, leaving out what the pipeline
itself rewrites or what is logged in full anyway (:data:`NOT_CODE`: ``dvc.lock``, the
``.gitignore`` files DVC maintains, ``metrics/``, ``plots/`` and ``params.yaml``), so a DVC
rewrite of ``dvc.lock`` mid-pipeline, or an experiment's ``-S`` override, does not mark the
code dirty. System metrics (CPU, memory, GPU) are MLflow's own switch,
``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` (needs psutil), off by default; an environment
variable rather than a param, because a param would make DVC re-run stages when it flips.

Where runs are logged: by default each stage queues what it logs on disk and a logging process
logs the queued runs (:mod:`acrb.tracking_queue`), so a stage never imports MLflow (about 3 s of
a short stage) nor waits for its store; ``acrb mlflow-sync`` waits until the queue is logged
(``make repro`` runs it after ``dvc repro``). ``ACRB_MLFLOW_BESIDE=0`` logs in the stage's own
process as it goes (:func:`log_run`); the runs are the same (tests/test_tracking_queue.py
compares them), their start and end times the stage's.

A stage that is killed (``kill -9``, an out-of-memory kill) cannot close its run: the logging
process logs its queued run as KILLED. A run logged in process by a killed stage is closed as
KILLED by the next stage of the experiment to start, which closes every RUNNING run whose owner
process is gone (:func:`close_orphaned_runs`), and leaves alone runs of live processes and of
other hosts. Params, tags, metric names and artifacts pass through :mod:`acrb.redaction`, so
no API key reaches the store or the queue. A tracking database that cannot be read stops the
stage with one error naming the file and the fix (:func:`check_tracking_store`), before the
stage writes anything; one that cannot be written (a full disk, a read-only file, an I/O
error), likewise when the run is opened, logged to or closed (:func:`_store_writable`). Queued,
such a run is kept, and the next stage and ``acrb mlflow-sync`` stop with that error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from acrb.errors import AcrbError
from acrb.redaction import active as redaction_active
from acrb.redaction import contains_secret, redact, redact_file, redact_value
from acrb.storage import TMP_PREFIX, write_csv

if TYPE_CHECKING:
    from acrb.config import Params

EXPERIMENT_PREFIX = "acrb/"
_EXPS_MARKER = (".dvc", "tmp", "exps")
#: The tag the MLflow 3 UI reads for an experiment's kind, and the kind of a classic ML
#: experiment (runs, params, metrics, compare) rather than a GenAI one (traces).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
PIPELINE_TAG = "acrb.pipeline"
PARENT_STAGE = "pipeline"
#: Longest param value MLflow stores (``mlflow.utils.validation.MAX_PARAM_VAL_LENGTH``).
MAX_PARAM_VALUE = 6000
#: Git pathspecs of what does not make a checkout dirty: what DVC and the stages rewrite while
#: the pipeline runs, and params.yaml, whose every value is logged on the parent run.
NOT_CODE = (":(exclude)dvc.lock", ":(exclude,glob)**/.gitignore", ":(exclude)metrics",
            ":(exclude)plots", ":(exclude)params.yaml")
#: The params sections a stage reads (its DVC params); model stages add ``models.<model>``.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "sources": ("profile", "sources"),
    "prompts": ("prompts",),
    "features": ("features",),
    "plan": ("plan", "winobias"),
    "generate": ("generate",),
    "evaluate": ("evaluate",),
    "judge": ("judge", "judges"),
    "analyze": ("analyze", "judge"),
    "analyze-compare": ("analyze",),
    "review_set": ("review",),
    "review": ("review", "analyze"),
    "tables": ("analyze", "report"),
    "report": ("report",),
}
#: The outcome labels of the headline metrics every ``analyze`` model run logs.
HEADLINE_OUTCOMES = ("refusal", "erasure", "lightening")
#: The headline metrics each model's ``analyze`` run also logs on the pipeline's parent run, as
#: ``<model>.<name>`` (:func:`parent_headline`).
PARENT_HEADLINE = (*(f"delta_{o}" for o in HEADLINE_OUTCOMES),
                   *(f"flagged.{o}" for o in HEADLINE_OUTCOMES))
#: Where ``mlflow ui`` and ``mlflow server`` listen unless told otherwise.
UI_ADDRESS = "http://127.0.0.1:5000"
#: The MLflow UI's shared views (its runs page's "Share" button, MLflow 3.17): the page's state
#: as JSON in the experiment tag ``mlflow.sharedViewState.<key>``, opened by the address
#: ``#/experiments/<id>/runs?viewStateShareKey=<key>``.
SHARED_VIEW_TAG = "mlflow.sharedViewState."
#: The key of the view the ``analyze`` stage shares (:func:`runs_view_state`).
RUNS_VIEW_KEY = "acrb-models"
#: The run name's column id in the UI's runs table (ids are ``<type>.`<name>```).
_RUN_NAME_COLUMN = "attributes.`Run Name`"


def stage_root(start: Path | None = None) -> Path:
    """The folder DVC runs the stage in: the nearest holding dvc.yaml (``start`` or the working
    directory, then its parents); outside any, ``start`` itself. Inside a queued or temporary
    experiment, that is the experiment's copy: its params, inputs and outputs are its own."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists():
            return folder
    return here


def tracking_root(start: Path | None = None) -> Path:
    """Where ``mlflow.db`` lives: the stage root, or for a copy under ``.dvc/tmp/exps/`` the
    project the experiment was started from (the copy is deleted when the experiment ends)."""
    root = stage_root(start)
    parts = root.parts
    for i in range(len(parts) - len(_EXPS_MARKER) + 1):
        if parts[i : i + len(_EXPS_MARKER)] == _EXPS_MARKER:
            return Path(*parts[:i])
    return root


def tracking_uri(start: Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at the tracking root (absolute path)."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    return f"sqlite:///{tracking_root(start) / 'mlflow.db'}"


def enabled() -> bool:
    return os.environ.get("ACRB_MLFLOW", "1").lower() not in ("0", "false", "off", "no")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20,
                          check=True).stdout.strip()


def git_state(root: Path | None = None) -> dict[str, str]:
    """Commit hash and dirty flag of the checkout at ``root`` (the stage root by default;
    "unknown" outside git). Dirty: a tracked file other than :data:`NOT_CODE` differs from
    the commit."""
    cwd = root or stage_root()
    try:
        commit = _git(cwd, "rev-parse", "HEAD")
        changed = _git(cwd, "status", "--porcelain", "--untracked-files=no", "--", ".",
                       *NOT_CODE)
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit, "git_dirty": "true" if changed else "false"}


def pipeline_key(params_hash: str, root: Path | None = None) -> str:
    """The key every stage of one pipeline run shares (see the module docstring):
    ``ACRB_PIPELINE_RUN`` if set, else a hash of the commit, the uncommitted code changes, the
    params hash and DVC's experiment name and baseline."""
    explicit = os.environ.get("ACRB_PIPELINE_RUN")
    if explicit:
        return _NAME_REFUSED.sub("_", explicit)[:250]  # it goes into a search filter
    cwd = root or stage_root()
    try:
        commit = _git(cwd, "rev-parse", "HEAD")
        changes = _git(cwd, "diff", "HEAD", "--no-ext-diff", "--", ".", *NOT_CODE)
    except (OSError, subprocess.SubprocessError):
        commit, changes = "unknown", ""
    parts = {"commit": commit, "changes": hashlib.sha256(changes.encode()).hexdigest(),
             "params": params_hash, "exp": os.environ.get("DVC_EXP_NAME", ""),
             "baseline": os.environ.get("DVC_EXP_BASELINE_REV", "")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def experiment_name(profile: str) -> str:
    return EXPERIMENT_PREFIX + profile


def run_name(stage: str, model: str | None = None) -> str:
    return stage if model is None else f"{stage}/{model}"


# ---- params, datasets, metrics ------------------------------------------------------------------


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Params as MLflow params under dotted names: mappings are walked (``analyze.confidence``),
    a list of plain values is one param in JSON (``plan.seeds = [0, 1]``), a list holding
    mappings is walked by position (``plan.prompt_sets.0.name``); an empty mapping is ``{}``."""
    if isinstance(value, Mapping):
        if not value and prefix:
            return {prefix: "{}"}
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(flatten_params(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    if isinstance(value, list | tuple):
        if any(isinstance(item, Mapping | list | tuple) for item in value):
            flat = {}
            for i, item in enumerate(value):
                flat.update(flatten_params(item, f"{prefix}.{i}"))
            return flat
        return {prefix: json.dumps(list(value), default=str)}
    return {prefix: _param_text(value)}


def params_of(params: Params, sections: Iterable[str] | None = None) -> dict[str, str]:
    """Dotted params of the validated ``params`` (every section, or the dotted ``sections``
    given, e.g. ``"analyze"``, ``"models.synthetic-fair"``); absent sections are skipped."""
    tree = params.model_dump(mode="json")
    if sections is None:
        return flatten_params(tree)
    flat: dict[str, str] = {}
    for section in sections:
        node: Any = tree
        for part in section.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            flat.update(flatten_params(node, section))
    return flat


#: What MLflow refuses in a param or metric name (it allows letters, digits, ``_-. :/``).
_NAME_REFUSED = re.compile(r"[^\w\-. :/]", flags=re.ASCII)


def mlflow_name(key: str) -> str:
    """``key`` with each character MLflow refuses in a name as ``_`` (``race.*`` becomes
    ``race._``), cut at MLflow's 250 characters."""
    return _NAME_REFUSED.sub("_", redact(key))[:250]


def _clean_params(params: Mapping[str, Any]) -> dict[str, str]:
    # Masked before the cut, so no part of a key survives it.
    return {mlflow_name(k): redact(_param_text(v))[:MAX_PARAM_VALUE] for k, v in params.items()}


def headline_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The short set of metrics every model run logs under the same names: for each outcome of
    :data:`HEADLINE_OUTCOMES` the model measured, ``delta_<outcome>`` (the largest pooled gap
    between groups) with ``.ci_low``/``.ci_high`` (its interval: the dimension that gives the
    largest gap, or the model's own pooled interval where it has one) and ``flagged.<outcome>``;
    and ``requests.total``/``.error``/``.missing``."""
    out: dict[str, float] = {}
    for label in HEADLINE_OUTCOMES:
        name = f"delta_{label}"
        if name not in metrics:
            continue
        delta = metrics[name]
        out[name] = delta
        low, high = metrics.get(f"{name}.ci_low"), metrics.get(f"{name}.ci_high")
        if low is None:
            # The pooled rows are ``delta_<label>.<dimension>`` (no category in the name).
            for key, value in metrics.items():
                rest = key[len(name) + 1:]
                if (key.startswith(name + ".") and "." not in rest and value == delta
                        and f"{key}.ci_low" in metrics):
                    low, high = metrics[f"{key}.ci_low"], metrics.get(f"{key}.ci_high")
                    break
        if low is not None:
            out[f"{name}.ci_low"] = low
        if high is not None:
            out[f"{name}.ci_high"] = high
        if f"flagged.{label}" in metrics:
            out[f"flagged.{label}"] = metrics[f"flagged.{label}"]
    for key in ("requests.total", "requests.error", "requests.missing"):
        if key in metrics:
            out[key] = metrics[key]
    return out


def parent_headline(model: str, metrics: Mapping[str, float]) -> dict[str, float]:
    """What one model's ``analyze`` run logs on the pipeline's parent run: the
    :data:`PARENT_HEADLINE` part of its :func:`headline_metrics` under ``<model>.<name>``
    (``synthetic-biased.delta_refusal``, ``synthetic-biased.flagged.refusal``), so one parent
    row of the runs table, and one chart per name, holds every model's headline."""
    head = headline_metrics(metrics)
    return {f"{model}.{name}": head[name] for name in PARENT_HEADLINE if name in head}


def runs_view_columns(parent_metrics: Iterable[str]) -> list[str]:
    """The Δ columns of the shared runs view, out of the parent's metric names: every model's
    ``delta_refusal`` first, then ``delta_erasure``, then ``delta_lightening``, models in the
    order given (the UI itself sorts metric columns by name, which groups them by model)."""
    names = list(dict.fromkeys(parent_metrics))
    return [name for outcome in HEADLINE_OUTCOMES for name in names
            if name.endswith(f".delta_{outcome}")]


def _header_width(name: str) -> int:
    """Pixels a runs-table column needs to show the header ``name`` whole: MLflow 3.17 (headless
    Chromium, Debian's fonts) draws ``synthetic-biased.delta_refusal`` 205 px wide after 12 px
    of padding, 6.8 px a character; 8 px a character and 40 px (about 35% more) leave room
    for the wider fonts of another system. The UI gives every metric 100 px, which cuts such
    names."""
    return 40 + 8 * len(name)


def _run_name_width(models: Iterable[str]) -> int:
    """Pixels the run name column needs for ``pipeline <DVC experiment name>`` and for the
    longest stage run name one level in, ``generate/<model>``: 80 px of indent, expander and
    colour dot, the name (6.3 px a character, measured as in :func:`_header_width`; 7.5
    counted, for wider fonts) and 20 px; at least 220. The UI's default, about 190, cuts
    ``generate/synthetic-biased`` once the parent is unfolded."""
    longest = max((len(run_name("generate", model)) for model in models), default=0)
    return max(220, 100 + round(7.5 * longest))


def runs_view_state(columns: Iterable[str], models: Iterable[str] = ()) -> dict[str, Any]:
    """The runs page's state that :meth:`StageRun.share_runs_view` stores: the metric
    ``columns`` of the parent run shown, in this order, right after the run name, each wide
    enough for its name, and the run name wide enough for the stage runs of ``models``; the
    rest as the UI's defaults (newest run first, stage runs folded under their parent)."""
    ids = {name: f"metrics.`{name}`" for name in columns}
    return {"selectedColumns": list(ids.values()),
            "columnOrder": [_RUN_NAME_COLUMN, *ids.values()],
            "columnWidths": {_RUN_NAME_COLUMN: _run_name_width(models),
                             **{ids[name]: _header_width(name) for name in ids}}}


#: Rows MLflow infers a logged table's column types from: its inference reads every value of
#: every text column (about a second for the plan's 14,000 requests, in each of four stages);
#: the first rows of an ACRB table have every column's type.
SCHEMA_ROWS = 500


def table_dataset(path: Path, name: str) -> Any:
    """An MLflow dataset of a Parquet table: its digest is MLflow's hash of the rows, its profile
    counts every row, its schema is inferred from the first :data:`SCHEMA_ROWS` rows."""
    import mlflow.data
    import pandas as pd
    from mlflow.data.pandas_dataset import PandasDataset

    frame = pd.read_parquet(path)
    # MLflow warns that a path source "can be interpreted in multiple ways" and about integer
    # columns in the schema it infers; neither concerns a table that is only an input record.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dataset = mlflow.data.from_pandas(  # type: ignore[attr-defined]
            frame, source=str(path), name=name)
        # ``schema`` is a functools.cached_property: filled here, MLflow reads it as computed.
        dataset.__dict__["schema"] = PandasDataset(
            frame.head(SCHEMA_ROWS), source=dataset.source, name=name).schema
    return dataset


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _writes_store(method: _Method) -> _Method:
    """A :class:`StageRun` method that writes to the store: a store that cannot be written is
    one error naming it (:func:`_store_writable`)."""

    @functools.wraps(method)
    def wrapper(self: StageRun, *args: Any, **kwargs: Any) -> Any:
        with _store_writable(self.store):
            return method(self, *args, **kwargs)

    return cast(_Method, wrapper)


class StageRun:
    """Handle on an active run; every method is a no-op when tracking is disabled. ``store``
    is the SQLite database the run is logged to (None for a tracking server). Every write names
    the run (``run_id``) rather than MLflow's active run, so a logging process can log runs of
    several stages one after another."""

    def __init__(self, active: bool, parent_id: str | None = None,
                 experiment_id: str | None = None, store: Path | None = None,
                 run_id: str | None = None) -> None:
        self.active = active
        self.parent_id = parent_id
        self.experiment_id = experiment_id
        self.store = store
        self.run_id = run_id
        self._logged: dict[str, str] = {}

    @staticmethod
    def _client() -> Any:
        import mlflow

        return mlflow.MlflowClient()

    @_writes_store
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params (MLflow keeps a param's first value). A name already logged (a params.yaml
        value the stage reports again) is skipped when the value is the same, and logged as
        ``<name>.resolved`` when the stage resolved it to another (a pinned revision, a label)."""
        if not self.active or not params:
            return
        from mlflow.entities import Param

        fresh: dict[str, str] = {}
        for key, value in _clean_params(params).items():
            if key in self._logged and self._logged[key] != value:
                key = f"{key}.resolved"
            if self._logged.get(key) != value:
                fresh[key] = value
        if fresh:
            self._client().log_batch(self.run_id, params=[Param(k, v) for k, v in fresh.items()])
            self._logged.update(fresh)

    @_writes_store
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log many metrics in one batch call (one call per metric is ~100x slower), at
        ``step`` (a sequential audit's round: MLflow draws each metric's history by step)."""
        if not self.active or not metrics:
            return
        self._batch(self.run_id, metrics, step)

    def _batch(self, run_id: str | None, metrics: Mapping[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), now, step)
                 for k, v in metrics.items() if v is not None and v == v]
        if batch:
            self._client().log_batch(run_id, metrics=batch)

    @_writes_store
    def log_on_parent(self, metrics: Mapping[str, float]) -> None:
        """Log ``metrics`` on the pipeline's parent run too, in one batch call (names as
        :meth:`log_metrics` cleans them; a metric logged again gets a new value at step 0)."""
        if not self.active or not self.parent_id or not metrics:
            return
        self._batch(self.parent_id, metrics)

    @_writes_store
    def share_runs_view(self, columns: Iterable[str], models: Iterable[str] = ()) -> None:
        """Store the experiment's shared runs view (:data:`RUNS_VIEW_KEY`, state of
        :func:`runs_view_state`), the one :func:`runs_address` opens: the parent runs' metric
        ``columns`` beside the run names, wide enough for the stage runs of ``models``. Stored
        again by each ``analyze``, so it shows the models of the newest one."""
        if not self.active or not self.experiment_id:
            return
        state = json.dumps(runs_view_state([mlflow_name(c) for c in columns], models))
        self._client().set_experiment_tag(self.experiment_id, SHARED_VIEW_TAG + RUNS_VIEW_KEY,
                                          state)

    @_writes_store
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Log a file or folder; Parquet files go as CSV of the same stem (the UI previews
        CSV, not Parquet)."""
        if self.active and path.exists():
            with _previewable(path) as readable, _redacted_copy(readable) as clean:
                if clean.is_dir():
                    self._client().log_artifacts(self.run_id, str(clean), artifact_path)
                else:
                    self._client().log_artifact(self.run_id, str(clean), artifact_path)

    @_writes_store
    def log_dataset(self, path: Path, context: str, *, on_parent: bool = True) -> None:
        """Log the Parquet table at ``path`` as an MLflow dataset input (name and context
        ``context``: "sources", "prompts", "plan"), on this run and on the pipeline's parent."""
        if not self.active or not path.exists():
            return
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        dataset = table_dataset(path, context)
        with warnings.catch_warnings():  # the schema MLflow infers: see table_dataset
            warnings.simplefilter("ignore", UserWarning)
            entry = DatasetInput(dataset._to_mlflow_entity(),
                                 tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
        self._client().log_inputs(self.run_id, datasets=[entry])
        if on_parent and self.parent_id:
            self._client().log_inputs(self.parent_id, datasets=[entry])

    def log_model_analysis(self, metrics: Mapping[str, float], tables: Path,
                           figures: Iterable[Path], model: str) -> None:
        """One model's analysis, under names that do not depend on the model: the
        :func:`headline_metrics` as metrics; every metric in ``metrics.csv``; the tables of
        ``tables`` as ``tables/*.csv`` (and JSON as is); the figures as ``figures/*.png``
        with the model's name taken off the front of the file name."""
        if not self.active:
            return
        import pandas as pd

        self.log_metrics(headline_metrics(metrics))
        with tempfile.TemporaryDirectory(prefix="acrb-analysis-") as folder:
            out = Path(folder)
            rows = [{"metric": k, "value": v} for k, v in sorted(metrics.items())]
            write_csv(pd.DataFrame(rows, columns=["metric", "value"]), out / "metrics.csv",
                      index=False)
            if tables.is_dir():
                (out / "tables").mkdir()
                for file in sorted(p for p in tables.iterdir()
                                   if p.is_file() and not p.name.startswith(TMP_PREFIX)):
                    if file.suffix == ".parquet":
                        write_csv(pd.read_parquet(file), out / "tables" / f"{file.stem}.csv",
                                  index=False)
                    elif file.suffix in (".json", ".csv"):
                        shutil.copy2(file, out / "tables" / file.name)
            (out / "figures").mkdir()
            for figure in figures:
                if figure.exists():
                    name = figure.name.removeprefix(f"{model}-")
                    shutil.copy2(figure, out / "figures" / name)
            self.log_artifact(out)

    @_writes_store
    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.active and tags:
            from mlflow.entities import RunTag

            clean = redact_value(dict(tags))
            self._client().log_batch(self.run_id, tags=[RunTag(k, str(v))
                                                        for k, v in clean.items()])


def _mark_experiment_kind(client: Any, experiment: Any) -> None:
    from mlflow.exceptions import MlflowException

    if (experiment.tags or {}).get(EXPERIMENT_KIND_TAG) == EXPERIMENT_KIND:
        return
    try:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    except MlflowException:
        # Two stages starting at once both set it; the other one's insert won.
        tags = client.get_experiment(experiment.experiment_id).tags
        if tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
            raise


def _source_tags(stage: str, git: Mapping[str, str]) -> dict[str, str]:
    tags = {"mlflow.source.name": f"acrb {stage}", "mlflow.source.type": "LOCAL"}
    if git.get("git_commit", "unknown") != "unknown":
        tags["mlflow.source.git.commit"] = git["git_commit"]
    return tags


def pipeline_parent(client: Any, experiment_id: str, key: str, *, profile: str,
                    params_hash: str, params: Mapping[str, str] | None,
                    git: Mapping[str, str], dvc_exp: Mapping[str, str] | None = None) -> str:
    """The run id of the parent run tagged ``acrb.pipeline = key``, created (with every param)
    when no stage of this pipeline run has made it yet; marked RUNNING while a stage runs."""
    from mlflow.entities import Param, RunStatus

    def parents() -> list[Any]:
        runs = client.search_runs(
            [experiment_id], max_results=100, filter_string=(
                f"tags.`{PIPELINE_TAG}` = '{key}' and tags.`acrb.stage` = '{PARENT_STAGE}'"))
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    found = parents()
    if found:
        run = found[0]
        if run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        return str(run.info.run_id)
    tags = {PIPELINE_TAG: key, "acrb.stage": PARENT_STAGE, "acrb.profile": profile,
            "acrb.params_hash": params_hash, **{f"acrb.{k}": v for k, v in git.items()},
            **_source_tags("pipeline", git)}
    exp = dict(dvc_experiment() if dvc_exp is None else dvc_exp)
    for env, tag in (("DVC_EXP_NAME", "acrb.dvc_exp_name"),
                     ("DVC_EXP_BASELINE_REV", "acrb.dvc_exp_baseline_rev")):
        if exp.get(env):
            tags[tag] = exp[env]
    name = f"pipeline {exp.get('DVC_EXP_NAME') or key[:8]}"
    run = client.create_run(experiment_id, run_name=name, tags=redact_value(tags))
    # Stages started at once (shards) may each have made one: all keep the earliest.
    first = parents()[0]
    if first.info.run_id != run.info.run_id:
        client.delete_run(run.info.run_id)
        return str(first.info.run_id)
    if params is not None:
        client.log_batch(run.info.run_id, params=[
            Param(k, v) for k, v in _clean_params(params).items()])
    return str(run.info.run_id)


def dvc_experiment() -> dict[str, str]:
    """The DVC experiment this process runs in: ``DVC_EXP_NAME`` and ``DVC_EXP_BASELINE_REV``
    where DVC set them."""
    return {name: os.environ[name] for name in ("DVC_EXP_NAME", "DVC_EXP_BASELINE_REV")
            if os.environ.get(name)}


@dataclass(frozen=True)
class RunSpec:
    """What opens one stage's run, all of it taken in the stage's process when the stage
    starts: what :func:`stage_run` was given (params flattened), the store, the checkout's git
    state and the pipeline key (:func:`pipeline_key`), DVC's experiment, the process that owns
    the run (:func:`owner_tags`) and when it started (ms). A logging process needs nothing
    else of the stage's folder or environment."""

    stage: str
    profile: str
    params_hash: str
    model: str | None
    simulated: bool
    extra_tags: dict[str, str]
    parent_params: dict[str, str] | None  # every param, logged when the parent is created
    stage_params: dict[str, str] | None  # this stage's sections
    owner: dict[str, str]
    uri: str
    git: dict[str, str]
    pipeline: str
    dvc_exp: dict[str, str]
    started: int


@contextmanager
def stage_run(stage: str, *, profile: str, params_hash: str, model: str | None = None,
              simulated: bool = False, extra_tags: Mapping[str, str] | None = None,
              params: Params | None = None) -> Iterator[RunLog]:
    """Open the MLflow run for one stage (and model), nested under the pipeline's parent run
    (found or created, see :func:`pipeline_parent`); with ``params``, log every param on a new
    parent and this stage's sections (:data:`STAGE_SECTIONS`, plus ``models.<model>``) on the
    stage run. Closes the run (and sets the parent's status) as FAILED on an exception.

    Where it is logged: by default (:func:`logs_beside`) the stage's calls are queued on disk
    and logged by a logging process (:mod:`acrb.tracking_queue`), so the stage neither imports
    MLflow nor waits for its store; with ``ACRB_MLFLOW_BESIDE=0``, in this process as the stage
    goes. The runs, params, metrics and artifacts are the same."""
    import time

    if not enabled():
        yield StageRun(active=False)
        return
    sections = [*STAGE_SECTIONS.get(stage, ()), *([f"models.{model}"] if model is not None else [])]
    spec = RunSpec(
        stage=stage, profile=profile, params_hash=params_hash, model=model,
        simulated=simulated, extra_tags=dict(extra_tags or {}),
        parent_params=None if params is None else params_of(params),
        stage_params=None if params is None else params_of(params, sections),
        owner=owner_tags(), uri=tracking_uri(), git=git_state(),
        pipeline=pipeline_key(params_hash), dvc_exp=dvc_experiment(),
        started=int(time.time() * 1000))
    # A store that is not a database is reported before the stage writes anything.
    check_tracking_store(spec.uri)
    if logs_beside():
        from acrb.tracking_queue import queued_run

        with queued_run(spec) as queued:
            yield queued
    else:
        with log_run(spec) as tracker:
            yield tracker


def logs_beside() -> bool:
    """Whether :func:`stage_run` queues the stage's calls for a logging process
    (``ACRB_MLFLOW_BESIDE``, on unless ``0``): MLflow's import and its store (about 3 s of a
    short stage) then stay off the stage's path."""
    return os.environ.get("ACRB_MLFLOW_BESIDE", "1").lower() not in ("0", "false", "off", "no")


class Closed(Exception):
    """Leaves :func:`log_run` with the run closed as ``status`` rather than FINISHED."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@contextmanager
def log_run(spec: RunSpec, ended: int | None = None) -> Iterator[StageRun]:
    """Open the run ``spec`` describes (started at ``spec.started``), yield its handle, and
    close it FINISHED, FAILED on an exception, or as :class:`Closed` says; ``ended`` (ms) is
    its end time, now by default. Used by :func:`stage_run` in process, and by the logging
    process for each queued run."""
    import time

    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        import mlflow
        from mlflow.tracking.context import registry as context_registry
    except ImportError as exc:  # pragma: no cover - mlflow is a core dependency
        raise AcrbError("mlflow is not installed",
                        "pip install -e . (or set ACRB_MLFLOW=0)") from exc
    uri = spec.uri
    check_tracking_store(uri)
    store = sqlite_store_path(uri)
    _quiet_reported_store_errors()
    with _using_store(uri):
        git = spec.git
        with _store_errors(uri):
            client = mlflow.MlflowClient()
            experiment = mlflow.set_experiment(experiment_name(spec.profile))
            _mark_experiment_kind(client, experiment)
            close_orphaned_runs(experiment.experiment_id)
            parent_id = pipeline_parent(client, experiment.experiment_id, spec.pipeline,
                                        profile=spec.profile, params_hash=spec.params_hash,
                                        params=spec.parent_params, git=git,
                                        dvc_exp=spec.dvc_exp)
        tags = {
            "acrb.stage": spec.stage,
            "acrb.profile": spec.profile,
            "acrb.params_hash": spec.params_hash,
            "acrb.simulated": str(spec.simulated).lower(),
            **{f"acrb.{k}": v for k, v in git.items()},
            **_source_tags(spec.stage, git),
        }
        if spec.model is not None:
            tags["acrb.model"] = spec.model
        if spec.dvc_exp.get("DVC_EXP_NAME"):
            tags["acrb.dvc_exp_name"] = spec.dvc_exp["DVC_EXP_NAME"]
        tags.update(spec.extra_tags)
        tags.update(spec.owner)
        name = run_name(spec.stage, spec.model)
        tags.update({"mlflow.parentRunId": parent_id, "mlflow.runName": name})
        with _store_errors(uri):
            run_id = client.create_run(
                experiment.experiment_id, start_time=spec.started, run_name=name,
                tags=context_registry.resolve_tags(redact_value(tags))).info.run_id
        status = "FAILED"
        try:
            tracker = StageRun(active=True, parent_id=parent_id,
                               experiment_id=experiment.experiment_id, store=store,
                               run_id=run_id)
            if spec.stage_params is not None:
                tracker.log_params(spec.stage_params)
            try:
                yield tracker
            except Closed as closed:
                status = closed.status
                if status == "KILLED":
                    client.set_tag(run_id, ORPHAN_TAG, (
                        f"owner process {spec.owner[OWNER_HOST_TAG]}:"
                        f"{spec.owner[OWNER_PID_TAG]} ended without closing the run; "
                        f"closed by its logging process {os.getpid()}"))
            else:
                status = "FINISHED"
        finally:
            # The run's end, then the parent's status; only these writes, not the stage's
            # own, are checked.
            with _store_writable(store):
                try:
                    client.set_terminated(run_id, status=status,
                                          end_time=ended or int(time.time() * 1000))
                finally:
                    client.set_terminated(parent_id,
                                          status="FAILED" if status == "KILLED" else status)


class RunLog(Protocol):
    """What :func:`stage_run` yields: a run logged here (:class:`StageRun`), or one queued for a
    logging process (:class:`acrb.tracking_queue.QueuedRun`); the calls a stage makes on it."""

    active: bool

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...
    def log_on_parent(self, metrics: Mapping[str, float]) -> None: ...
    def share_runs_view(self, columns: Iterable[str], models: Iterable[str] = ()) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_dataset(self, path: Path, context: str, *, on_parent: bool = True) -> None: ...
    def log_model_analysis(self, metrics: Mapping[str, float], tables: Path,
                           figures: Iterable[Path], model: str) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...


def _open_store(uri: str) -> None:
    """Import MLflow and open the store at ``uri`` (made when it is new), as a run does."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    check_tracking_store(uri)
    _quiet_reported_store_errors()
    with _using_store(uri), _store_errors(uri):
        mlflow.MlflowClient().search_experiments(max_results=1)


# ---- the address to open -------------------------------------------------------------------


def runs_address(profile: str, base: str | None = None,
                 start: Path | None = None) -> tuple[str, str | None]:
    """The MLflow UI address of the runs of ``profile``'s experiment, and why it is only the
    experiments list when it is (None when it is not).

    ``base`` is where the UI is served: by default ``MLFLOW_TRACKING_URI`` when it is a
    server's address, else :data:`UI_ADDRESS`. With the shared view the ``analyze`` stage
    stores (:meth:`StageRun.share_runs_view`): ``#/experiments/<id>/runs?viewStateShareKey=
    acrb-models``, the parent runs with every model's Δ beside the run names; without it
    (runs logged before the view existed) ``#/experiments/<id>/runs``. With no store or no
    such experiment yet, or a store that cannot be read, the experiments list of the model
    training pages. Reads the store only when it exists (a SQLite file is never created
    here)."""
    uri = tracking_uri(start)
    remote = uri.startswith(("http://", "https://"))
    base = (base or (uri if remote else UI_ADDRESS)).rstrip("/")
    fallback = f"{base}/#/experiments?workflowType=machine_learning"
    path = sqlite_store_path(uri)
    if path is not None and not path.exists():
        return fallback, f"no MLflow store at {path} yet (run the pipeline first)"
    name = experiment_name(profile)
    try:
        with _quick_requests():
            from mlflow import MlflowClient

            experiment = MlflowClient(uri).get_experiment_by_name(name)
    except Exception as exc:  # printing an address must never stop `make repro`
        first = (redact(str(exc)).strip().splitlines() or [type(exc).__name__])[0]
        return fallback, f"could not read the MLflow store {redact(uri)} ({first[:200]})"
    if experiment is None:
        return fallback, f"no experiment {name} in {redact(uri)} yet (run the pipeline first)"
    runs = f"{base}/#/experiments/{experiment.experiment_id}/runs"
    if SHARED_VIEW_TAG + RUNS_VIEW_KEY in (experiment.tags or {}):
        return f"{runs}?viewStateShareKey={RUNS_VIEW_KEY}", None
    return runs, None


@contextmanager
def _quick_requests() -> Iterator[None]:
    """No retries and a 10 s timeout for MLflow's HTTP calls (a server that is down answers
    at once, rather than after minutes of retries), unless the user set their own."""
    chosen = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    added = [name for name in chosen if name not in os.environ]
    os.environ.update({name: chosen[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextmanager
def _using_store(uri: str) -> Iterator[None]:
    """Point MLflow at ``uri`` for one stage run, then put back what was there.
    ``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI`` to the process environment,
    which :func:`tracking_uri` reads first: without this, a second stage run in the same process
    (stages run in process, a notebook, a test) would log to the first one's store."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        # None unsets both MLflow's global and the variable (its annotation omits None).
        mlflow.set_tracking_uri(before)  # type: ignore[arg-type]


# ---- artifacts the UI can show ------------------------------------------------------------------


@contextmanager
def _previewable(path: Path) -> Iterator[Path]:
    """``path`` itself, or, when it is or holds Parquet files, a copy in a temporary folder
    (same name) with each Parquet file written as CSV of the same stem."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    if not any(f.suffix == ".parquet" for f in files):
        yield path
        return
    import pandas as pd

    with _temporary_copy(path, "acrb-csv-") as (copy, copied):
        for file in copied:
            if file.suffix == ".parquet":
                write_csv(pd.read_parquet(file), file.with_suffix(".csv"), index=False)
                file.unlink()
        yield copy if path.is_dir() else copy.with_suffix(".csv")


@contextmanager
def _temporary_copy(path: Path, prefix: str) -> Iterator[tuple[Path, list[Path]]]:
    """A copy of the file or folder ``path`` (same name) in a temporary folder, and the files
    in it; removed on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        copy = Path(folder) / path.name
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        yield copy, [copy] if copy.is_file() else [p for p in copy.rglob("*") if p.is_file()]


# ---- secrets in artifacts -----------------------------------------------------------------------


@contextmanager
def _redacted_copy(path: Path) -> Iterator[Path]:
    """``path`` itself, or, when a text file in it holds a registered key, a masked copy (same
    names) in a temporary folder."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    if not redaction_active() or not any(contains_secret(f.read_bytes()) for f in files):
        yield path
        return
    with _temporary_copy(path, "acrb-artifact-") as (copy, copied):
        for file in copied:
            redact_file(file)
        yield copy


# ---- a tracking store that cannot be read -------------------------------------------------------

#: The first 16 bytes of every SQLite 3 database.
SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, or None for any other store."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return Path(uri[len(prefix):].split("?", 1)[0])


def _store_error(path: Path, what: str) -> AcrbError:
    return AcrbError(
        f"the MLflow tracking store {path} {what}",
        f"move it aside to start a fresh tracking store (mv {path} {path}.bad; the runs logged "
        "in it are not in the new one), or restore it from a backup; ACRB_MLFLOW=0 runs the "
        "stage without tracking",
    )


def check_tracking_store(uri: str) -> None:
    """Raise one :class:`AcrbError` naming the file and the fix when the SQLite tracking
    database exists but is not a database (a folder, garbage bytes, another kind of file).
    A missing or empty file is fine: MLflow creates the store."""
    path = sqlite_store_path(uri)
    if path is None or not path.exists():
        return
    if not path.is_file():
        raise _store_error(path, "is not a file")
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise _store_error(path, f"cannot be read ({exc.strerror or exc})") from exc
    if head and head != SQLITE_HEADER:
        raise _store_error(path, "is not an SQLite database (corrupt or overwritten)")


@contextmanager
def _store_errors(uri: str) -> Iterator[None]:
    """A failure of MLflow to open a SQLite store (a damaged database behind a valid header)
    as the same one-line error as :func:`check_tracking_store`."""
    import sqlite3

    from sqlalchemy.exc import DatabaseError

    path = sqlite_store_path(uri)
    try:
        with _store_writable(path):
            yield
    except (DatabaseError, sqlite3.DatabaseError) as exc:
        if path is None:
            raise
        text = redact(str(exc)).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        if "locked" in first:
            raise AcrbError(
                f"the MLflow tracking store {path} is locked by another process ({first[:200]})",
                "wait for the other stage to finish (one writer per SQLite store), or log to an "
                "MLflow tracking server (MLFLOW_TRACKING_URI=http://...)") from exc
        raise _store_error(path, f"cannot be opened ({first[:200]})") from exc


#: What SQLite says (lower case) when it cannot write the store: a full disk (SQLITE_FULL:
#: "database or disk is full"), a read-only file, folder or file system (SQLITE_READONLY:
#: "attempt to write a readonly database"), a failing disk (SQLITE_IOERR: "disk I/O error").
_UNWRITABLE = ("disk is full", "readonly database", "disk i/o error")
#: The logger MLflow logs a store's SQL errors to, with a traceback, before raising them.
_MLFLOW_STORE_LOG = "mlflow.store.db.utils"


def _unwritable_reason(error: BaseException) -> str | None:
    """SQLite's message when ``error``, or an error it was raised from (MLflow raises its own
    from SQLAlchemy's), is SQLite's or SQLAlchemy's saying the store cannot be written
    (:data:`_UNWRITABLE`); None for any other error."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error | DBAPIError):
            orig = getattr(current, "orig", None)
            text = str(orig if isinstance(orig, BaseException) else current)
            for line in text.splitlines():
                if any(marker in line.lower() for marker in _UNWRITABLE):
                    return line.replace("(sqlite3.OperationalError)", "").strip()[:200]
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def _store_writable(path: Path | None) -> Iterator[None]:
    """A write to the SQLite store ``path`` that fails because the store cannot be written (a
    full disk, a read-only file or folder, an I/O error) as one :class:`AcrbError` naming the
    file and the fix. Other errors, and any error of a tracking server (``path`` None), pass."""
    try:
        yield
    except AcrbError:
        raise
    except Exception as exc:
        reason = _unwritable_reason(exc) if path is not None else None
        if path is None or reason is None:
            raise
        raise AcrbError(
            f"the MLflow tracking store {path} cannot be written ({reason})",
            f"free space on the disk that holds {path.parent} (df -h {path.parent}), or make "
            f"{path.name} and its folder writable, then rerun the stage; ACRB_MLFLOW=0 runs the "
            "stage without tracking") from exc


class _ReportedStoreError(logging.Filter):
    """Drops MLflow's own log (a traceback) of a store that cannot be written: the stage
    reports it as one error line (:func:`_store_writable`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or _unwritable_reason(error) is None


def _quiet_reported_store_errors() -> None:
    logger = logging.getLogger(_MLFLOW_STORE_LOG)
    if not any(isinstance(f, _ReportedStoreError) for f in logger.filters):
        logger.addFilter(_ReportedStoreError())


# ---- runs orphaned by a kill --------------------------------------------------------------------

OWNER_HOST_TAG = "acrb.owner_host"
OWNER_PID_TAG = "acrb.owner_pid"
OWNER_STARTED_TAG = "acrb.owner_started"
ORPHAN_TAG = "acrb.closed_as_orphan"

log = logging.getLogger("acrb.tracking")


def process_started(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc``), or "" where
    that cannot be read. Together with the PID it names one process even after PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # Field 22; the command name (field 2) is in parentheses and may hold spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def owner_tags() -> dict[str, str]:
    """The tags that name this process as a run's owner."""
    pid = os.getpid()
    return {OWNER_HOST_TAG: socket.gethostname(), OWNER_PID_TAG: str(pid),
            OWNER_STARTED_TAG: process_started(pid)}


def owner_is_gone(tags: Mapping[str, str]) -> bool:
    """Whether the process named by a run's owner tags has certainly ended: it ran on this host
    and its PID is free, or now belongs to a process that started at another time. Runs of other
    hosts, and runs without owner tags (logged before they existed), are never judged gone."""
    host, pid_text = tags.get(OWNER_HOST_TAG), tags.get(OWNER_PID_TAG, "")
    if host != socket.gethostname() or not (pid_text.isascii() and pid_text.isdigit()):
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, under another user
    started = tags.get(OWNER_STARTED_TAG, "")
    now = process_started(pid)
    return bool(started and now and started != now)


def close_orphaned_runs(experiment_id: str) -> list[str]:
    """Mark KILLED every RUNNING run of the experiment whose owner process is gone
    (:func:`owner_is_gone`); returns their run ids. Needs an active tracking URI."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    closed: list[str] = []
    page_token = None
    while True:
        page = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                  max_results=1000, page_token=page_token)
        for run in page:
            if not owner_is_gone(run.data.tags):
                continue
            run_id = run.info.run_id
            owner = f"{run.data.tags[OWNER_HOST_TAG]}:{run.data.tags[OWNER_PID_TAG]}"
            client.set_tag(run_id, ORPHAN_TAG, f"owner process {owner} ended without closing "
                           f"the run; closed by process {os.getpid()}")
            client.set_terminated(run_id, status="KILLED")
            closed.append(run_id)
            log.warning("MLflow run %s (%s) was left RUNNING by process %s, which is gone: "
                        "marked KILLED", run_id, run.data.tags.get("mlflow.runName", "?"), owner)
        page_token = page.token
        if not page_token:
            return closed
