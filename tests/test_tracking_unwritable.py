"""A tracking store that cannot be written (a full disk, a read-only file, a failing disk).

SQLite's error is injected where SQLite raises it, under SQLAlchemy and MLflow's handling of it,
at the three places a stage writes to the store: opening it, logging inside the run, closing
the run. Each stops the stage with exit 2 and one error naming ``mlflow.db`` and the fix, and
nothing printed is a traceback. Errors that are not the store's, or not about writing, pass.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from acrb import tracking
from tests.conftest import update_params

# ---- a store that cannot be written -------------------------------------------------------------

def _stage_params() -> Any:
    """Picks the write of the stage run's own params: the first INSERT INTO params after the
    second run is inserted (the pipeline's parent is the first, and gets params of its own)."""
    runs = 0

    def when(statement: str) -> bool:
        nonlocal runs
        if statement.startswith("INSERT INTO runs"):
            runs += 1
            return False
        return statement.startswith("INSERT INTO params") and runs >= 2

    return when


#: When the injected SQLite error strikes (each makes a fresh picker): every write (the store
#: cannot even be opened); a write of the stage run's own params (logging, inside the run); the
#: update that ends a run (closing it).
_WHEN = {
    "opening": lambda: lambda statement: True,
    "logging": _stage_params,
    "closing": lambda: lambda statement: (statement.startswith("UPDATE runs")
                                          and "end_time" in statement),
}


def _active_run() -> Any:
    import mlflow

    return mlflow.active_run()


@contextmanager
def _failing_writes(message: str, when: Any) -> Iterator[list[str]]:
    """SQLite raises ``message`` for every write statement ``when`` picks, as it does on a full
    disk or a read-only file: through SQLAlchemy and MLflow's own handling of it."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    failed: list[str] = []

    def fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = statement.lstrip()
        if text.upper().startswith(("INSERT", "UPDATE", "DELETE", "CREATE")) and when(text):
            failed.append(text)
            raise sqlite3.OperationalError(message)

    event.listen(Engine, "before_cursor_execute", fail)
    try:
        yield failed
    finally:
        event.remove(Engine, "before_cursor_execute", fail)
        while _active_run() is not None:  # a run the failure left open in this process
            import mlflow

            mlflow.end_run("FAILED")


@pytest.mark.parametrize("message", ["database or disk is full",
                                     "attempt to write a readonly database", "disk I/O error"])
@pytest.mark.parametrize("when", list(_WHEN))
def test_a_store_that_cannot_be_written_is_one_error_naming_it(
        project: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        message: str, when: str) -> None:
    from typer.testing import CliRunner

    from acrb.cli import app

    update_params(project, lambda p: p["prompts"].update(synthesis=None))
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = project / "mlflow.db"
    with _failing_writes(message, _WHEN[when]()) as failed:
        result = CliRunner().invoke(app, ["prompts"])
    assert failed, "no write was refused"
    assert result.exit_code == 2, (result.output, result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: the MLflow tracking store {store} cannot be written ({message})"]
    assert f"  fix: free space on the disk that holds {project} (df -h {project})" in \
        result.output and "ACRB_MLFLOW=0 runs the stage without tracking" in result.output
    printed = result.output + capfd.readouterr().err
    assert "Traceback" not in printed and "OperationalError" not in printed, printed


def test_only_the_trackers_own_writes_are_blamed_on_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client call that raises SQLAlchemy's disk-full error is the one error; another error of
    the store, or the stage's own SQLite error (a review store on the same full disk), passes."""
    import mlflow
    from sqlalchemy.exc import OperationalError

    from acrb.errors import AcrbError

    def full(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("INSERT INTO metrics", {},
                               sqlite3.OperationalError("database or disk is full"))

    def locked(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("INSERT INTO metrics", {},
                               sqlite3.OperationalError("database is locked"))

    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "mlflow.db"
    with (pytest.raises(AcrbError) as raised,
          tracking.stage_run("analyze", profile="default", params_hash="h") as run):
        monkeypatch.setattr(mlflow.MlflowClient, "log_batch", full)
        run.log_metrics({"delta_refusal": 0.1})
    assert raised.value.problem == (f"the MLflow tracking store {store} cannot be written "
                                    "(database or disk is full)")
    assert "ACRB_MLFLOW=0" in (raised.value.fix or "")
    with (pytest.raises(OperationalError, match="database is locked"),
          tracking.stage_run("analyze", profile="default", params_hash="h") as run):
        monkeypatch.setattr(mlflow.MlflowClient, "log_batch", locked)
        run.log_metrics({"delta_refusal": 0.1})
    with (pytest.raises(sqlite3.OperationalError, match="disk is full"),
          tracking.stage_run("review", profile="default", params_hash="h")):
        raise sqlite3.OperationalError("database or disk is full")
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    statuses = sorted((run.info.run_name.split()[0], run.info.status) for run in runs)
    assert statuses == [("analyze", "FAILED"), ("analyze", "FAILED"), ("pipeline", "FAILED"),
                        ("review", "FAILED")], statuses  # every run was closed all the same
