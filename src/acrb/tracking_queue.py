"""MLflow runs queued on disk by the stages and logged by a logging process.

A stage that logged to MLflow itself spent about 3 s of its time on it (importing MLflow 1.8 s,
its SQLite store 1.3 s, then its calls): most of a short stage, 18 times over in a
``dvc repro``. Instead, :func:`queued_run` writes what the stage logs to a queue folder,
``.acrb-cache/mlflow-queue/`` at the tracking root (:func:`acrb.tracking.tracking_root`), and
one logging process per queue (:func:`drain`) logs the queued runs in order while the stages go
on. The stage never imports MLflow.

An entry is a folder named by its start time and process (``<ns>-<pid>-<n>``):

- ``run.json``, written when the stage starts: the run (:class:`acrb.tracking.RunSpec`);
- ``files/``, copies of the files the stage logs, taken when it ends (a later stage, or a
  rerun, may change or delete the originals; keys registered with :mod:`acrb.redaction` are
  masked in the copies, so no key is written to the queue);
- ``end.json``, written last, when the stage ends: its outcome (FINISHED, or FAILED on an
  exception), its logging calls in order (keys masked) and when it ended.

Each file appears whole (written aside, then renamed). The logging process logs an entry with
``end.json`` as the stage ended, and an entry without one whose stage process is gone (a kill)
as KILLED, then removes it; a run it cannot log (a store that cannot be opened or written) is
moved to ``failed/`` with ``error.json`` (the problem and its fix), and the next stage, or
``acrb mlflow-sync``, stops with that error. ``acrb mlflow-sync`` logs the failed entries again
once the cause is fixed, and waits until the queue is logged; ``make repro`` runs it after
``dvc repro``, so the runs are all in MLflow when it ends. Nothing queued is lost: an entry
leaves the queue only once its run is logged.

One logging process at a time holds the queue's lock (``drainer.lock``): a stage starts one
when none holds it (:func:`ensure_logger`), at its start, so that it imports MLflow while the
stage works. It waits for new entries while a stage is running, then :data:`IDLE_SECONDS`
more, and ends; its output goes to ``drainer.log``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from acrb.errors import AcrbError
from acrb.tracking import (
    Closed,
    RunSpec,
    enabled,
    log_run,
    logs_beside,
    owner_is_gone,
    tracking_root,
)

log = logging.getLogger("acrb.tracking")

QUEUE_FOLDER = Path(".acrb-cache") / "mlflow-queue"
RUN_FILE = "run.json"
END_FILE = "end.json"
ERROR_FILE = "error.json"
FAILED_FOLDER = "failed"
LOCK_FILE = "drainer.lock"
LOG_FILE = "drainer.log"
#: How long a logging process waits for another entry once none is left and no stage is
#: running (the gap between two stages of a ``dvc repro`` is shorter).
IDLE_SECONDS = 15.0
#: How often it looks for entries.
POLL_SECONDS = 0.1
#: The logging methods whose arguments name files, and which arguments do.
_FILE_ARGUMENTS = {"log_artifact": (0,), "log_dataset": (0,), "log_model_analysis": (1, 2)}

_entries_made = itertools.count()
#: The logging processes this process started, by queue: one still starting (it has not taken
#: the lock yet) is not started again.
_started: dict[Path, subprocess.Popen[bytes]] = {}


def queue_folder(start: Path | None = None) -> Path:
    """The queue of the tracking root of ``start`` (the working folder by default)."""
    return tracking_root(start) / QUEUE_FOLDER


# ---- the stage's side -----------------------------------------------------------------------


class QueuedRun:
    """The handle :func:`acrb.tracking.stage_run` yields when the run is queued: it has
    :class:`acrb.tracking.StageRun`'s logging methods and keeps each call in order; the files
    named are copied when the stage ends, as they are then."""

    active = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []

    def _keep(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, list(args), kwargs))

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._keep("log_params", dict(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self._keep("log_metrics", dict(metrics), **({"step": step} if step else {}))

    def log_on_parent(self, metrics: Mapping[str, float]) -> None:
        self._keep("log_on_parent", dict(metrics))

    def share_runs_view(self, columns: Iterable[str], models: Iterable[str] = ()) -> None:
        self._keep("share_runs_view", list(columns), list(models))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._keep("log_artifact", Path(path), artifact_path)

    def log_dataset(self, path: Path, context: str, *, on_parent: bool = True) -> None:
        self._keep("log_dataset", Path(path), context, on_parent=on_parent)

    def log_model_analysis(self, metrics: Mapping[str, float], tables: Path,
                           figures: Iterable[Path], model: str) -> None:
        self._keep("log_model_analysis", dict(metrics), Path(tables),
                   [Path(f) for f in figures], model)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._keep("set_tags", dict(tags))


@contextmanager
def queued_run(spec: RunSpec) -> Iterator[QueuedRun]:
    """:func:`acrb.tracking.stage_run`'s run, queued: a run an earlier stage queued and the
    logging process could not log stops this stage first (:func:`raise_failures`); the entry
    is begun and a logging process started if none is running; when the stage ends, its
    files and calls are added with its outcome (FINISHED, or FAILED on an exception)."""
    folder = queue_folder()
    raise_failures(folder)
    entry = _begin(folder, spec)
    ensure_logger(folder)
    queued = QueuedRun()
    try:
        yield queued
    except BaseException:
        try:
            _end(entry, "FAILED", queued.calls)
        except Exception as exc:  # the stage's own error is the one to report
            log.warning("the failed stage's MLflow run could not be queued in full: %s", exc)
        raise
    _end(entry, "FINISHED", queued.calls)
    ensure_logger(folder)  # in case the one running has just ended


def _write_whole(path: Path, payload: Any) -> None:
    """``payload`` as JSON at ``path``, which appears whole or not at all."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(json.dumps(payload, default=_plain, indent=1), encoding="utf-8")
    os.replace(aside, path)


def _plain(value: Any) -> Any:
    """JSON for what the stages log besides JSON's own types: paths and NumPy numbers."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot queue a value of type {type(value).__name__} for MLflow: {value!r}")


def _begin(folder: Path, spec: RunSpec) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_entries_made)}"
    aside = folder / f".{name}"
    aside.mkdir()
    _write_whole(aside / RUN_FILE, dataclasses.asdict(spec))
    entry = folder / name
    aside.rename(entry)
    return entry


def _end(entry: Path, outcome: str, calls: list[tuple[str, list[Any], dict[str, Any]]]) -> None:
    """Copy the files the calls name into ``entry/files`` (keys masked) and write
    ``end.json`` with the calls, naming the copies by their place in the entry."""
    from acrb.redaction import redact_value, registered_names

    kept: list[list[Any]] = []
    for number, (method, args, kwargs) in enumerate(calls):
        args = list(args)
        for index in _FILE_ARGUMENTS.get(method, ()):
            args[index] = _copy_files(args[index], entry, f"files/{number}/{index}")
        kept.append([method, args, kwargs])
    plain = json.loads(json.dumps(kept, default=_plain))
    ending = {"outcome": outcome, "calls": redact_value(plain), "secrets": registered_names(),
              "ended": int(time.time() * 1000)}
    _write_whole(entry / END_FILE, ending)


def _copy_files(value: Any, entry: Path, place: str) -> Any:
    """Copies of the file or folder ``value`` (a path, or a list of paths) under
    ``entry/place``, as paths relative to the entry; a path that does not exist stays as it
    is (the logging method skips it)."""
    from acrb.redaction import active, contains_secret, redact_file

    if isinstance(value, list):
        return [_copy_files(item, entry, f"{place}/{i}") for i, item in enumerate(value)]
    source = Path(value)
    if not source.exists():
        return os.path.abspath(source)
    copy = entry / place / source.name
    copy.parent.mkdir(parents=True)
    if source.is_dir():
        shutil.copytree(source, copy)
        files = [p for p in copy.rglob("*") if p.is_file()]
    else:
        shutil.copy2(source, copy)
        files = [copy]
    if active():
        for file in files:
            if contains_secret(file.read_bytes()):
                redact_file(file)
    return copy.relative_to(entry).as_posix()


def _locked(handle: IO[str]) -> bool:
    """Take the queue's lock without waiting; False when a logging process holds it."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def ensure_logger(folder: Path) -> None:
    """Start a logging process for the queue ``folder`` unless one is running."""
    folder.mkdir(parents=True, exist_ok=True)
    mine = _started.get(folder)
    if mine is not None and mine.poll() is None:
        return
    with (folder / LOCK_FILE).open("a") as handle:
        if not _locked(handle):
            return
        fcntl.flock(handle, fcntl.LOCK_UN)
    import acrb

    env = dict(os.environ)
    package_root = str(Path(acrb.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with (folder / LOG_FILE).open("ab") as output:
        _started[folder] = subprocess.Popen(
            [sys.executable, "-c", "from acrb.tracking_queue import drain; drain()",
             str(folder)], cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True)


def start_logging() -> None:
    """Start the logging process of this project's queue now, if runs are queued, so that it
    imports MLflow while the stage loads its code and params; the stage commands call this
    first."""
    if enabled() and logs_beside():
        with suppress(OSError):  # the stage's run reports a queue it cannot write
            ensure_logger(queue_folder())


# ---- the queue's state ------------------------------------------------------------------------


def _entries(folder: Path) -> list[Path]:
    try:
        names = sorted(p.name for p in folder.iterdir())
    except FileNotFoundError:
        return []
    return [folder / n for n in names if n[:1].isdigit()]


def _ready(entry: Path) -> bool:
    """Whether ``entry`` can be logged: its stage ended, or its process is gone."""
    if (entry / END_FILE).exists():
        return True
    try:
        spec = json.loads((entry / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return owner_is_gone(spec["owner"]) and not (entry / END_FILE).exists()


def failures(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The entries the logging process could not log, oldest first, with their errors."""
    found = []
    for entry in _entries(folder / FAILED_FOLDER):
        try:
            error = json.loads((entry / ERROR_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            error = {"problem": "the logging process ended while logging it", "fix": None}
        found.append((entry, error))
    return found


def raise_failures(folder: Path) -> None:
    """One :class:`AcrbError` for the oldest queued run that could not be logged, with its
    error's fix and how to log it once fixed."""
    found = failures(folder)
    if not found:
        return
    entry, error = found[0]
    try:
        spec = json.loads((entry / RUN_FILE).read_text(encoding="utf-8"))
        what = spec["stage"] + (f"/{spec['model']}" if spec.get("model") else "")
    except (OSError, ValueError, KeyError):
        what = entry.name
    more = f" ({len(found) - 1} more after it)" if len(found) > 1 else ""
    fix = error.get("fix") or (f"see the traceback in {entry / ERROR_FILE}; ACRB_MLFLOW=0 "
                               "runs the stages without tracking")
    raise AcrbError(
        f"MLflow could not log the run of stage {what}{more}, kept in {entry}: "
        f"{error.get('problem', '?')}",
        f"{fix}; once fixed, `acrb mlflow-sync` logs the kept runs")


def wait_for_queue(start: Path | None = None, timeout: float = 600.0) -> int:
    """Wait until every ended run in the queue of ``start``'s tracking root is logged (a stage
    still running elsewhere is not waited for), starting a logging process when none runs;
    returns how many were waited for. Raises the error of a run that could not be logged
    (:func:`raise_failures`), or after ``timeout`` seconds."""
    folder = queue_folder(start)
    deadline = time.monotonic() + timeout
    waited: set[str] = set()
    while True:
        pending = [e for e in _entries(folder) if _ready(e)]
        waited.update(e.name for e in pending)
        if not pending:
            raise_failures(folder)
            return len(waited)
        if time.monotonic() > deadline:
            raise AcrbError(
                f"{len(pending)} MLflow runs are still queued in {folder} after {timeout:.0f} s",
                f"see what its logging process wrote in {folder / LOG_FILE}, then run "
                "`acrb mlflow-sync` again")
        ensure_logger(folder)
        time.sleep(POLL_SECONDS)


def sync(start: Path | None = None, timeout: float = 600.0) -> int:
    """``acrb mlflow-sync``: put the runs that could not be logged back in the queue, and wait
    until the queue is logged (:func:`wait_for_queue`); returns how many runs were logged."""
    folder = queue_folder(start)
    for entry, _ in failures(folder):
        (entry / ERROR_FILE).unlink(missing_ok=True)
        entry.rename(folder / entry.name)
    return wait_for_queue(start, timeout)


# ---- the logging process ----------------------------------------------------------------------


def drain() -> None:
    """The logging process of the queue named on the command line: logs every ready entry in
    order (:func:`_log_entry`), waits while a stage is running and then :data:`IDLE_SECONDS`
    more, and ends; ends at once when another logging process holds the queue's lock."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    folder = Path(sys.argv[1])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    try:
        handle = (folder / LOCK_FILE).open("a")
    except OSError:
        return  # the project is gone
    with handle:
        if not _locked(handle):
            return
        _warm_up()
        quiet_since = time.monotonic()
        while True:
            entries = _entries(folder)
            if not entries and not folder.exists():
                return
            ready = [e for e in entries if _ready(e)]
            for entry in ready:
                if not _log_entry(folder, entry):
                    # What MLflow keeps of a store that failed (open connections) must not
                    # meet the fixed one: `acrb mlflow-sync` starts a new logging process.
                    return
            if ready or len(ready) < len(entries):  # logged, or a stage is still running
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > IDLE_SECONDS:
                fcntl.flock(handle, fcntl.LOCK_UN)
                # An entry begun just before the lock was let go has seen it held: take it
                # back for that entry, unless the stage has started another process already.
                if not _entries(folder) or not _locked(handle):
                    return
            time.sleep(POLL_SECONDS)


def _warm_up() -> None:
    """Import MLflow and its SQLite store's module before the first entry arrives."""
    with suppress(Exception):
        logging.getLogger("alembic").setLevel(logging.WARNING)
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def _log_entry(folder: Path, entry: Path) -> bool:
    """Log one entry's run and remove the entry; one that cannot be logged goes to
    ``failed/`` with the error (False)."""
    import traceback

    try:
        _replay(entry)
    except Exception as exc:
        problem = getattr(exc, "problem", None) or f"{type(exc).__name__}: {exc}"
        error = {"problem": problem, "fix": getattr(exc, "fix", None),
                 "traceback": traceback.format_exc()}
        log.error("MLflow run of %s not logged: %s", entry.name, problem)
        failed = folder / FAILED_FOLDER
        failed.mkdir(exist_ok=True)
        _write_whole(entry / ERROR_FILE, error)
        entry.rename(failed / entry.name)
        return False
    done = entry.with_name(f".done-{entry.name}")
    entry.rename(done)
    shutil.rmtree(done, ignore_errors=True)
    return True


def _replay(entry: Path) -> None:
    """Log the run of ``entry``: as its stage ended, or as KILLED when it has no end."""
    from acrb.redaction import redact_value, register_secret

    spec = RunSpec(**json.loads((entry / RUN_FILE).read_text(encoding="utf-8")))
    ending_path = entry / END_FILE
    ending = (json.loads(ending_path.read_text(encoding="utf-8"))
              if ending_path.exists() else None)
    if ending is not None:
        for name in ending["secrets"]:
            register_secret(name, os.environ.get(name))
    with log_run(spec, ended=None if ending is None else ending["ended"]) as tracker:
        if ending is None:
            raise Closed("KILLED")
        for method, args, kwargs in redact_value(ending["calls"]):
            for index in _FILE_ARGUMENTS.get(method, ()):
                args[index] = _in_entry(args[index], entry)
            getattr(tracker, method)(*args, **kwargs)
        if ending["outcome"] != "FINISHED":
            raise Closed(ending["outcome"])


def _in_entry(value: Any, entry: Path) -> Any:
    """A path of ``end.json`` as a path: relative ones are copies in the entry."""
    if isinstance(value, list):
        return [_in_entry(item, entry) for item in value]
    path = Path(value)
    return path if path.is_absolute() else entry / path
