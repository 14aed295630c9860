"""MLflow bookkeeping that survives kills and a damaged store.

A stage killed with ``kill -9`` cannot close its MLflow run; the next stage to start marks it
KILLED, and leaves alone the runs of processes that still live. A ``mlflow.db`` that is not a
database stops a stage with one error naming the file and the fix (exit 2), before the stage
writes anything.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acrb import tracking
from acrb.cli import app
from tests.conftest import REPO, write_params

# ---- owners -------------------------------------------------------------------------------------


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_owner_is_gone_only_for_an_ended_process_of_this_host() -> None:
    me = tracking.owner_tags()
    assert me[tracking.OWNER_PID_TAG] == str(os.getpid()) and me[tracking.OWNER_STARTED_TAG]
    assert not tracking.owner_is_gone(me)
    assert not tracking.owner_is_gone({})  # a run logged before owners were recorded
    ended = {**me, tracking.OWNER_PID_TAG: str(_ended_pid())}
    assert tracking.owner_is_gone(ended)
    assert not tracking.owner_is_gone({**ended, tracking.OWNER_HOST_TAG: "another-host"})
    # The PID lives, but is another process than the one that opened the run (PID reuse).
    parent = os.getppid()
    reused = {**me, tracking.OWNER_PID_TAG: str(parent), tracking.OWNER_STARTED_TAG: "1"}
    assert tracking.process_started(parent) != "1"
    assert tracking.owner_is_gone(reused)
    assert not tracking.owner_is_gone({**reused, tracking.OWNER_STARTED_TAG:
                                       tracking.process_started(parent)})


# ---- a killed stage's run -----------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    from acrb.tracking import stage_run
    with stage_run(sys.argv[1], profile="orphans", params_hash="h") as run:
        print(run.run_id, flush=True)
        time.sleep(600)
""")


def _hold_a_run(stage: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A process that opens a stage's run, prints its id and waits (to be killed)."""
    return subprocess.Popen([sys.executable, "-c", _HOLDER, stage], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _run_id(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    assert run_id, "the child did not open its run"
    return run_id


def test_a_killed_stages_run_is_closed_and_a_live_ones_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(tracking.experiment_name("orphans"))  # the store exists before
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    killed, live = _hold_a_run("generate", env), _hold_a_run("evaluate", env)
    try:
        killed_run, live_run = _run_id(killed), _run_id(live)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        client = MlflowClient()
        assert client.get_run(killed_run).info.status == "RUNNING"  # nobody closed it
        assert client.get_run(killed_run).data.tags[tracking.OWNER_HOST_TAG] == \
            socket.gethostname()

        with tracking.stage_run("generate", profile="orphans", params_hash="h"):
            pass
        closed = client.get_run(killed_run)
        assert closed.info.status == "KILLED" and closed.info.end_time is not None
        assert "ended without closing" in closed.data.tags[tracking.ORPHAN_TAG]
        assert client.get_run(live_run).info.status == "RUNNING"
        assert tracking.ORPHAN_TAG not in client.get_run(live_run).data.tags
    finally:
        for child in (killed, live):
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)


# ---- a damaged store ----------------------------------------------------------------------------


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64)


def _folder(path: Path) -> None:
    path.mkdir()


def _damaged_sqlite(path: Path) -> None:
    """A real SQLite header over scrambled pages (a disk error, a partial copy)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [(f"row {i}",) for i in range(2000)])
    db.close()
    data = bytearray(path.read_bytes())
    data[100:] = bytes((i * 37 + 11) % 256 for i in range(len(data) - 100))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_garbage, _folder, _damaged_sqlite],
                         ids=["garbage", "folder", "damaged-sqlite"])
def test_a_damaged_mlflow_db_is_one_error_and_outputs_stay(
        project: Path, monkeypatch: pytest.MonkeyPatch, damage) -> None:
    write_params(project, {"prompts": {"synthesis": None}})
    runner = CliRunner()
    first = runner.invoke(app, ["prompts"])  # MLflow off (the project fixture)
    assert first.exit_code == 0, first.output
    before = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    store = project / "mlflow.db"
    damage(store)
    monkeypatch.setenv("ACRB_MLFLOW", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    result = runner.invoke(app, ["prompts"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and f"the MLflow tracking store {store}" in errors[0], result.output
    assert any(line.startswith("  fix: move it aside") and f"mv {store} {store}.bad" in line
               for line in lines)
    assert "Traceback" not in result.output
    after = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    assert after == before
