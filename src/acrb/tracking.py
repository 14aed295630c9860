"""MLflow: the one place that knows run names, tags, the store location and artifacts.

The store is SQLite (MLflow's file store is in maintenance mode and refuses to start unless
told otherwise) at ``<project root>/mlflow.db``. The project root is resolved from the folder
that holds ``dvc.yaml``, and when a stage runs inside ``dvc exp run --queue``/``--temp`` (a
temporary copy under ``<root>/.dvc/tmp/exps/``) from the original project, so queued runs are not
logged into a folder that DVC deletes afterwards. ``MLFLOW_TRACKING_URI`` overrides all of this;
``ACRB_MLFLOW=0`` turns logging off (for quick experiments and some tests).

Layout: one experiment per profile (``acrb/<profile>``), one run per stage (and per model for
``generate``, ``evaluate`` and ``analyze``), tagged with the git commit, a dirty flag,
``DVC_EXP_NAME`` when set, the params hash and the stage, and the process that owns it
(``acrb.owner_host``, ``acrb.owner_pid``, ``acrb.owner_started``). A stage that is killed
(``kill -9``, an out-of-memory kill) cannot close its run; the next stage of the experiment to
start closes every RUNNING run whose owner process is gone as KILLED (:func:`close_orphaned_runs`),
and leaves alone runs of live processes and of other hosts. Params, tags, metric names and
artifacts pass through :mod:`acrb.redaction`, so no API key reaches the store. A tracking
database that cannot be read stops the stage with one error naming the file and the fix
(:func:`check_tracking_store`), before the stage writes anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from acrb.errors import AcrbError
from acrb.redaction import active as redaction_active
from acrb.redaction import contains_secret, redact, redact_file, redact_value

EXPERIMENT_PREFIX = "acrb/"
_EXPS_MARKER = (".dvc", "tmp", "exps")


def project_root(start: Path | None = None) -> Path:
    """The project folder (holding dvc.yaml); outside any, ``start`` itself."""
    here = (start or Path.cwd()).resolve()
    parts = here.parts
    for i in range(len(parts) - len(_EXPS_MARKER) + 1):
        if parts[i : i + len(_EXPS_MARKER)] == _EXPS_MARKER:
            return Path(*parts[:i])
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists():
            return folder
    return here


def tracking_uri(start: Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at the project root (absolute path)."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    return f"sqlite:///{project_root(start) / 'mlflow.db'}"


def enabled() -> bool:
    return os.environ.get("ACRB_MLFLOW", "1").lower() not in ("0", "false", "off", "no")


def git_state(root: Path | None = None) -> dict[str, str]:
    """Commit hash and dirty flag of the project checkout ("unknown" outside git)."""
    cwd = root or project_root()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = "true" if git("status", "--porcelain", "--untracked-files=no") else "false"
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit, "git_dirty": dirty}


def experiment_name(profile: str) -> str:
    return EXPERIMENT_PREFIX + profile


def run_name(stage: str, model: str | None = None) -> str:
    return stage if model is None else f"{stage}/{model}"


class StageRun:
    """Handle on an active run; every method is a no-op when tracking is disabled."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.active:
            import mlflow

            # Masked before the cut, so no part of a key survives it.
            flat = {redact(k): redact(str(v))[:6000] for k, v in params.items()}
            mlflow.log_params(flat)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Log many metrics in one batch call (one call per metric is ~100x slower)."""
        if not self.active or not metrics:
            return
        import mlflow

        clean = {redact(k): float(v) for k, v in metrics.items() if v is not None and v == v}
        mlflow.log_metrics(clean)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.active and path.exists():
            import mlflow

            with _redacted_copy(path) as clean:
                if clean.is_dir():
                    mlflow.log_artifacts(str(clean), artifact_path)
                else:
                    mlflow.log_artifact(str(clean), artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.active:
            import mlflow

            mlflow.set_tags(redact_value(dict(tags)))


@contextmanager
def stage_run(stage: str, *, profile: str, params_hash: str, model: str | None = None,
              simulated: bool = False, extra_tags: Mapping[str, str] | None = None
              ) -> Iterator[StageRun]:
    """Open the MLflow run for one stage (and model); closes it as FAILED on an exception."""
    if not enabled():
        yield StageRun(active=False)
        return
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        import mlflow
    except ImportError as exc:  # pragma: no cover - mlflow is a core dependency
        raise AcrbError("mlflow is not installed",
                        "pip install -e . (or set ACRB_MLFLOW=0)") from exc
    uri = tracking_uri()
    check_tracking_store(uri)
    mlflow.set_tracking_uri(uri)
    with _store_errors(uri):
        experiment = mlflow.set_experiment(experiment_name(profile))
        close_orphaned_runs(experiment.experiment_id)
    tags = {
        "acrb.stage": stage,
        "acrb.profile": profile,
        "acrb.params_hash": params_hash,
        "acrb.simulated": str(simulated).lower(),
        **{f"acrb.{k}": v for k, v in git_state().items()},
    }
    if model is not None:
        tags["acrb.model"] = model
    if os.environ.get("DVC_EXP_NAME"):
        tags["acrb.dvc_exp_name"] = os.environ["DVC_EXP_NAME"]
    tags.update(extra_tags or {})
    tags.update(owner_tags())
    with _store_errors(uri):
        started = mlflow.start_run(run_name=run_name(stage, model), tags=redact_value(tags))
    with started:
        yield StageRun(active=True)


# ---- secrets in artifacts -----------------------------------------------------------------------


@contextmanager
def _redacted_copy(path: Path) -> Iterator[Path]:
    """``path`` itself, or, when a text file in it holds a registered key, a masked copy (same
    names) in a temporary folder."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    if not redaction_active() or not any(contains_secret(f.read_bytes()) for f in files):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="acrb-artifact-") as folder:
        copy = Path(folder) / path.name
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        for file in [copy] if copy.is_file() else [p for p in copy.rglob("*") if p.is_file()]:
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
    if host != socket.gethostname() or not pid_text.isdigit():
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
