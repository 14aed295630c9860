"""MLflow logged by a process beside the stage (the default outside the test suite).

The stage hands its calls to a logging process when it ends; the runs must be the ones the
stage would have logged itself, its failure must close them as FAILED and still reach the user
as the stage's own error, a kill must not leave them RUNNING, the logging process's own errors
must arrive as one error with their fix, and keys registered by the stage must be masked there
too.
"""

from __future__ import annotations

import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from acrb import redaction, tracking
from acrb.errors import AcrbError
from tests.conftest import REPO
from tests.test_tracking_orphans import _damaged_sqlite

KEY_ENV = "ACRB_TEST_BESIDE_KEY"
KEY = "sk-beside-" + "0123456789abcdefghijklmnopqrstuv"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("ACRB_PIPELINE_RUN", "beside-test")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")  # the stage root
    return tmp_path / "mlflow.db"


def _one_stage(folder: Path, fail: bool = False) -> None:
    """A stage that uses every logging method, as the stages do."""
    folder.mkdir(exist_ok=True)
    table = folder / "plan.parquet"
    pd.DataFrame({"request_id": ["a", "b"], "race": ["Black", "White"]}).to_parquet(table)
    (folder / "tables").mkdir(exist_ok=True)
    pd.DataFrame({"x": [1.0]}).to_parquet(folder / "tables" / "rates.parquet")
    figure = folder / "synthetic-fair-heatmap.png"
    figure.write_bytes(b"\x89PNG not really")
    note = folder / "note.md"
    note.write_text("a note\n")
    with tracking.stage_run("analyze", profile="beside", params_hash="h",
                            model="synthetic-fair", simulated=True) as run:
        run.log_params({"model": "synthetic-fair", "count": 2})
        run.log_params({"model": "synthetic-fair"})  # the same again: skipped
        run.log_metrics({"requests.total": 2, "nan": float("nan")})
        run.log_on_parent({"synthetic-fair.delta_refusal": 0.25})
        run.share_runs_view(["synthetic-fair.delta_refusal"], ["synthetic-fair"])
        run.log_artifact(note, "notes")
        run.log_dataset(table, "plan")
        run.log_model_analysis({"delta_refusal": 0.25, "flagged.refusal": 1.0},
                               folder / "tables", [figure], "synthetic-fair")
        run.set_tags({"acrb.extra": "yes"})
        if fail:
            raise ValueError("the stage broke")


def _runs(store: Path) -> dict[str, Any]:
    """What the store holds, without what differs between any two runs (ids, times, owners)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(tracking.experiment_name("beside"))
    varying = {tracking.OWNER_PID_TAG, tracking.OWNER_STARTED_TAG, "mlflow.parentRunId"}
    seen: dict[str, Any] = {}
    for run in client.search_runs([experiment.experiment_id]):
        name = run.data.tags["mlflow.runName"]
        artifacts = sorted(
            a.path for top in client.list_artifacts(run.info.run_id)
            for a in ([top] if not top.is_dir else client.list_artifacts(run.info.run_id,
                                                                          top.path)))
        seen[name] = {
            "status": run.info.status,
            "params": run.data.params,
            "metrics": run.data.metrics,
            "tags": {k: v for k, v in run.data.tags.items() if k not in varying},
            "inputs": sorted((d.dataset.name, d.dataset.digest)
                             for d in run.inputs.dataset_inputs),
            "artifacts": artifacts,
        }
    seen["view"] = experiment.tags.get(tracking.SHARED_VIEW_TAG + tracking.RUNS_VIEW_KEY)
    return seen


def test_logged_beside_the_runs_are_the_ones_logged_here(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    seen = {}
    for beside in ("0", "1"):
        # A store of each (MLflow keeps a store open per address, so not the same file moved).
        path = store.with_name(f"beside-{beside}.db")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
        monkeypatch.setenv("ACRB_MLFLOW_BESIDE", beside)
        _one_stage(store.parent / "work")
        seen[beside] = _runs(path)
    here, beside = seen["0"], seen["1"]
    assert here["analyze/synthetic-fair"]["status"] == "FINISHED"
    assert here["analyze/synthetic-fair"]["tags"]["acrb.extra"] == "yes"
    assert here["analyze/synthetic-fair"]["artifacts"]  # the comparison compares something
    assert beside == here
    assert mlflow.active_run() is None


def test_a_failed_stage_closes_its_runs_failed_and_its_error_wins(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    with pytest.raises(ValueError, match="the stage broke"):
        _one_stage(store.parent / "work", fail=True)
    runs = _runs(store)
    assert runs["analyze/synthetic-fair"]["status"] == "FAILED"
    assert runs["pipeline beside-t"]["status"] == "FAILED"
    # What the stage logged before it failed is kept.
    assert runs["analyze/synthetic-fair"]["metrics"]["requests.total"] == 2


def test_the_logging_process_error_is_one_error_with_its_fix(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    _damaged_sqlite(store)  # a real SQLite header: only opening it tells
    with pytest.raises(AcrbError) as caught:
        _one_stage(store.parent / "work")
    assert caught.value.problem.startswith(f"the MLflow tracking store {store} cannot be opened")
    assert f"mv {store} {store}.bad" in caught.value.fix
    # The stage's own failure still wins over the store's.
    with pytest.raises(ValueError, match="the stage broke"):
        _one_stage(store.parent / "work", fail=True)


def test_keys_the_stage_registered_are_masked_by_the_logging_process(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    monkeypatch.setenv(KEY_ENV, KEY)
    assert redaction.register_secret(KEY_ENV, KEY)
    leak = store.parent / "leak.txt"
    leak.write_text(f"the server echoed {KEY}\n")
    with tracking.stage_run("prompts", profile="beside", params_hash="h") as run:
        run.log_params({"prompts.writer": f"key={KEY}"})
        run.log_artifact(leak, "prompts")
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(tracking.experiment_name("beside"))
    (stage,) = client.search_runs([experiment.experiment_id],
                                  filter_string="tags.`acrb.stage` = 'prompts'")
    assert stage.data.params["prompts.writer"] == f"key={redaction.mask(KEY_ENV)}"
    stored = Path(client.download_artifacts(stage.info.run_id, "prompts/leak.txt",
                                            str(store.parent / "down")))
    assert KEY not in stored.read_text() and redaction.mask(KEY_ENV) in stored.read_text()


_KILLED = textwrap.dedent("""
    import sys, time
    from acrb.tracking import stage_run
    with stage_run("generate", profile="beside", params_hash="h") as run:
        run.log_metrics({"done": 1})
        print("working; MLflow imported here:", "mlflow" in sys.modules, flush=True)
        time.sleep(600)
""")


def _statuses(store: Path, stage: str) -> list[str]:
    """The statuses of ``stage``'s runs, read with SQLite alone: an MLflow client here would
    set up the store while the logging process does."""
    if not store.exists():
        return []
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT runs.status FROM runs JOIN tags ON "
                              "tags.run_uuid = runs.run_uuid WHERE tags.key = 'acrb.stage' "
                              "AND tags.value = ?", (stage,)).fetchall()
    except sqlite3.Error:  # not set up yet
        return []
    return [status for (status,) in rows]


def test_a_killed_stages_run_is_closed_by_its_logging_process(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "ACRB_MLFLOW_BESIDE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    stage = subprocess.Popen([sys.executable, "-c", _KILLED], env=env, cwd=store.parent,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stage.stdout is not None and stage.stdout.readline().strip() == (
            "working; MLflow imported here: False")
        deadline = time.monotonic() + 120
        while not _statuses(store, "generate"):  # the logging process opened the run
            assert time.monotonic() < deadline, "the logging process never opened the run"
            time.sleep(0.5)
        stage.send_signal(signal.SIGKILL)
        stage.wait(timeout=30)
        while _statuses(store, "generate") == ["RUNNING"]:
            assert time.monotonic() < deadline, "the killed stage's run stayed RUNNING"
            time.sleep(0.5)
    finally:
        if stage.poll() is None:
            stage.kill()
            stage.wait(timeout=30)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    (run,) = client.search_runs(
        [client.get_experiment_by_name(tracking.experiment_name("beside")).experiment_id],
        filter_string="tags.`acrb.stage` = 'generate'")
    assert run.info.status == "KILLED"
    assert "ended without closing the run" in run.data.tags[tracking.ORPHAN_TAG]
    assert run.data.tags[tracking.OWNER_PID_TAG] == str(stage.pid)  # the stage owns it


def test_the_deferred_handle_has_every_logging_method_of_a_run() -> None:
    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(member) for name, member in vars(cls).items()
                if callable(member) and not name.startswith("_")}

    assert methods(tracking.DeferredRun) == methods(tracking.StageRun)


def test_one_logging_process_serves_a_stage_processs_runs_one_after_another(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    tracking.start_logging()  # as a stage command does first
    (started,) = [logger.process.pid for logger in tracking._idle_loggers]
    served = []
    for model in ("synthetic-fair", "synthetic-biased"):
        with tracking.stage_run("analyze", profile="beside", params_hash="h",
                                model=model) as run:
            served.append(tracking._idle_loggers == [])  # taken while the run is open
            run.log_metrics({"requests.total": 1})
    assert served == [True, True]
    assert [logger.process.pid for logger in tracking._idle_loggers] == [started]
    statuses = [status for stage in ("analyze",) for status in _statuses(store, stage)]
    assert statuses == ["FINISHED", "FINISHED"]
