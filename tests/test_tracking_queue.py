"""MLflow runs queued by the stages and logged by a logging process (the default outside the
test suite; acrb.tracking_queue).

The runs logged from the queue must be the ones the stage would have logged itself; a failed
stage's runs are closed as FAILED and its own error still reaches the user; a killed stage's
run is closed as KILLED, not left out; a run the logging process cannot log is kept and stops
the next stage and `acrb mlflow-sync` with one error and its fix, and is logged once the cause
is fixed; the queue holds copies of the files as the stage left them, and no registered key is
written to it or to the store.
"""

from __future__ import annotations

import inspect
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from acrb import redaction, tracking, tracking_queue
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


def test_queued_runs_are_the_ones_logged_here(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    seen = {}
    for beside in ("0", "1"):
        # A store of each (MLflow keeps a store open per address, so not the same file moved).
        path = store.with_name(f"beside-{beside}.db")
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
        monkeypatch.setenv("ACRB_MLFLOW_BESIDE", beside)
        _one_stage(store.parent / "work")
        if beside == "1":
            assert "mlflow" not in sys.modules or mlflow.active_run() is None
            assert tracking_queue.wait_for_queue() == 1
        seen[beside] = _runs(path)
    here, queued = seen["0"], seen["1"]
    assert here["analyze/synthetic-fair"]["status"] == "FINISHED"
    assert here["analyze/synthetic-fair"]["tags"]["acrb.extra"] == "yes"
    assert here["analyze/synthetic-fair"]["artifacts"]  # the comparison compares something
    assert queued == here
    assert mlflow.active_run() is None
    assert tracking_queue._entries(tracking_queue.queue_folder()) == []  # logged, then removed


def test_a_failed_stage_closes_its_runs_failed_and_its_error_wins(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    with pytest.raises(ValueError, match="the stage broke"):
        _one_stage(store.parent / "work", fail=True)
    tracking_queue.wait_for_queue()
    runs = _runs(store)
    assert runs["analyze/synthetic-fair"]["status"] == "FAILED"
    assert runs["pipeline beside-t"]["status"] == "FAILED"
    # What the stage logged before it failed is kept.
    assert runs["analyze/synthetic-fair"]["metrics"]["requests.total"] == 2


def test_a_run_that_cannot_be_logged_is_kept_and_stops_the_next_stage_until_synced(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    _damaged_sqlite(store)  # a real SQLite header: only opening it tells
    _one_stage(store.parent / "work")  # the stage itself does not open the store
    with pytest.raises(AcrbError) as caught:
        tracking_queue.wait_for_queue()
    problem, fix = caught.value.problem, caught.value.fix or ""
    assert problem.startswith("MLflow could not log the run of stage analyze/synthetic-fair")
    assert f"the MLflow tracking store {store} cannot be opened" in problem
    assert f"mv {store} {store}.bad" in fix and "acrb mlflow-sync" in fix
    (kept,) = tracking_queue.failures(tracking_queue.queue_folder())
    assert str(kept[0]) in problem
    # The next stage stops before it works, with the same error.
    worked = []
    with pytest.raises(AcrbError) as again, \
            tracking.stage_run("report", profile="beside", params_hash="h"):
        worked.append(True)
    assert worked == [] and again.value.problem == problem
    # Fixed as the error says, `acrb mlflow-sync` logs the kept run.
    store.rename(store.with_name("mlflow.db.bad"))
    assert tracking_queue.sync() == 1
    assert _runs(store)["analyze/synthetic-fair"]["status"] == "FINISHED"
    assert tracking_queue.failures(tracking_queue.queue_folder()) == []


def test_the_queue_holds_the_files_as_the_stage_left_them(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    note = store.parent / "note.md"
    note.write_text("as the stage wrote it\n")
    with monkeypatch.context() as held:  # no logging process until the file has changed
        held.setattr(tracking_queue, "ensure_logger", lambda folder: None)
        with tracking.stage_run("report", profile="beside", params_hash="h") as run:
            run.log_artifact(note, "report")
        note.write_text("changed by a later stage\n")
    tracking_queue.wait_for_queue()
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(tracking.experiment_name("beside"))
    (stage,) = client.search_runs([experiment.experiment_id],
                                  filter_string="tags.`acrb.stage` = 'report'")
    stored = Path(client.download_artifacts(stage.info.run_id, "report/note.md",
                                            str(store.parent / "down")))
    assert stored.read_text() == "as the stage wrote it\n"


def test_no_registered_key_reaches_the_queue_or_the_store(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    monkeypatch.setenv(KEY_ENV, KEY)
    assert redaction.register_secret(KEY_ENV, KEY)
    leak = store.parent / "leak.txt"
    leak.write_text(f"the server echoed {KEY}\n")
    with monkeypatch.context() as held:
        held.setattr(tracking_queue, "ensure_logger", lambda folder: None)
        with tracking.stage_run("prompts", profile="beside", params_hash="h") as run:
            run.log_params({"prompts.writer": f"key={KEY}"})
            run.set_tags({"acrb.writer": f"key={KEY}"})
            run.log_artifact(leak, "prompts")
        queued = [p for p in tracking_queue.queue_folder().rglob("*") if p.is_file()]
        assert any(p.name == "leak.txt" for p in queued)
        assert all(KEY.encode() not in p.read_bytes() for p in queued)
    tracking_queue.wait_for_queue()
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name(tracking.experiment_name("beside"))
    (stage,) = client.search_runs([experiment.experiment_id],
                                  filter_string="tags.`acrb.stage` = 'prompts'")
    assert stage.data.params["prompts.writer"] == f"key={redaction.mask(KEY_ENV)}"
    assert stage.data.tags["acrb.writer"] == f"key={redaction.mask(KEY_ENV)}"
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


def test_a_killed_stages_run_is_logged_as_killed(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "ACRB_MLFLOW_BESIDE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    stage = subprocess.Popen([sys.executable, "-c", _KILLED], env=env, cwd=store.parent,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stage.stdout is not None and stage.stdout.readline().strip() == (
            "working; MLflow imported here: False")
        (entry,) = tracking_queue._entries(tracking_queue.queue_folder())
        stage.send_signal(signal.SIGKILL)
        stage.wait(timeout=30)
    finally:
        if stage.poll() is None:
            stage.kill()
            stage.wait(timeout=30)
    assert tracking_queue.wait_for_queue(timeout=120) == 1
    assert not entry.exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store}")
    (run,) = client.search_runs(
        [client.get_experiment_by_name(tracking.experiment_name("beside")).experiment_id],
        filter_string="tags.`acrb.stage` = 'generate'")
    assert run.info.status == "KILLED"
    assert "ended without closing the run" in run.data.tags[tracking.ORPHAN_TAG]
    assert run.data.tags[tracking.OWNER_PID_TAG] == str(stage.pid)  # the stage owns it


def test_a_running_stages_entry_is_left_for_later(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    with tracking.stage_run("generate", profile="beside", params_hash="h") as run:
        run.log_metrics({"done": 1})
        assert tracking_queue.wait_for_queue() == 0  # this process is alive: not KILLED
        (entry,) = tracking_queue._entries(tracking_queue.queue_folder())
    assert tracking_queue.wait_for_queue() == 1
    assert not entry.exists()
    assert _statuses(store, "generate") == ["FINISHED"]


def test_the_queued_handle_has_every_logging_method_of_a_run() -> None:
    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(member) for name, member in vars(cls).items()
                if callable(member) and not name.startswith("_")}

    assert methods(tracking_queue.QueuedRun) == methods(tracking.StageRun)


def test_one_logging_process_logs_the_queue(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW_BESIDE", "1")
    folder = tracking_queue.queue_folder()
    tracking_queue.start_logging()  # as a stage command does first
    first = tracking_queue._started[folder]
    for model in ("synthetic-fair", "synthetic-biased"):
        with tracking.stage_run("analyze", profile="beside", params_hash="h",
                                model=model) as run:
            run.log_metrics({"requests.total": 1})
    assert tracking_queue.wait_for_queue() == 2
    assert tracking_queue._started[folder] is first and first.poll() is None
    # A second logging process sees the lock held and ends at once.
    second = subprocess.run(
        [sys.executable, "-c", "from acrb.tracking_queue import drain; drain()", str(folder)],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert second.returncode == 0 and first.poll() is None
    assert _statuses(store, "analyze") == ["FINISHED", "FINISHED"]
