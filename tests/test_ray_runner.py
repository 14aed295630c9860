"""The Ray runner of `generate` and `judge` on a local Ray cluster started by the test (two CPUs,
fractional CPUs per actor): the same records as the local runner, byte for byte; a lost actor's
batch retried on its restarted self with nothing lost or written twice; a driver killed mid-run
resumed by a rerun."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acrb import layout
from acrb.config import RayParams
from acrb.errors import AcrbError
from acrb.journal import JOURNAL_DIR, RecordStore
from acrb.records import GenerationRecord
from acrb.runners import actor_plan, run_batches
from acrb.stages import evaluate, generate, judge, plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.timings import read_timings, timings_path
from tests.conftest import deep_update, update_params, write_params

ray = pytest.importorskip("ray", reason="the Ray runner's tests need ray (the dev extra)")

MODEL = "synthetic-biased"
#: Two actors of half a CPU each fit the two-CPU cluster with room for the driver's work.
ON_RAY = {"ray": {"actors": 2, "cpus_per_actor": 0.5, "gpus_per_actor": 0,
                  "start_timeout_seconds": 120}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local Ray cluster of two CPUs for this module; the runner finds this process connected
    and uses it (it starts and stops its own cluster otherwise)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def _configure(root: Path, changes: dict[str, Any]) -> StageContext:
    """``root``'s params with ``changes`` merged in, loaded."""
    return update_params(root, lambda params: params.update(deep_update(params, changes)))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: ``MODEL`` generated and evaluated by the local runner."""
    root = tmp_path_factory.mktemp("local") / "project"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACRB_MLFLOW", "0")
        root.mkdir(parents=True)
        (root / "dvc.yaml").write_text("stages: {}\n")
        write_params(root, {"generate": {"batch_size": 8}})
        ctx = update_params(root, lambda p: p.update(models={MODEL: p["models"][MODEL]}))
        for stage in (sources, prompts, plan):
            stage.run(ctx)
        generate.run(ctx, MODEL)
        evaluate.run(ctx, MODEL)
    return root


def _copy_planned(reference: Path, root: Path) -> None:
    """``reference``'s project at ``root`` without its generations (same plan and sources)."""
    shutil.copytree(reference, root, ignore=shutil.ignore_patterns("generations", "logs",
                                                                   "judgements", "scores"))


def test_generate_on_ray_writes_the_local_runners_records(cluster: Any, local_run: Path,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    root = tmp_path / "ray"
    _copy_planned(local_run, root)
    ctx = _configure(root, {"generate": {"runner": "ray"}, **ON_RAY})
    summary = generate.run(ctx, MODEL)
    assert summary.complete and summary.generated == summary.planned == 400

    folder = layout.generations_dir(MODEL)
    assert _files(root / folder) == _files(local_run / folder)

    timings = read_timings(timings_path(root, "generate", MODEL))
    stored = RecordStore(root / folder, GenerationRecord).load()
    assert len(stored) == 400 and sorted(t.request_id for t in timings) == sorted(stored)
    assert {t.runner for t in timings} == {"ray"}
    assert all(t.node and t.actor for t in timings)
    assert len({t.actor for t in timings}) == 2, "both actors took batches"
    local = read_timings(timings_path(local_run, "generate", MODEL))
    assert len(local) == 400 and {(t.runner, t.node, t.actor) for t in local} == {
        ("local", "", "")} and {t.pid for t in local} == {os.getpid()}

    # A rerun on either runner finds everything done.
    again = generate.run(ctx, MODEL)
    assert again.generated == 0 and again.skipped == 400


def test_judge_on_ray_writes_the_local_runners_records(cluster: Any, local_run: Path,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    on_ray, local = tmp_path / "ray", tmp_path / "local"
    for root in (on_ray, local):
        shutil.copytree(local_run, root, ignore=shutil.ignore_patterns("scores"))
    judge.run(StageContext.load(local / "params.yaml", local), MODEL)
    ctx = _configure(on_ray, {"judge": {"runner": "ray", "batch_size": 8}, **ON_RAY})
    summary = judge.run(ctx, MODEL)
    assert sum(summary.asked.values()) > 0
    scores = layout.scores_dir(MODEL)
    ours, theirs = _files(on_ray / scores), _files(local / scores)
    assert ours.keys() == theirs.keys() and ours == theirs
    timings = read_timings(timings_path(on_ray, "judge", MODEL))
    asked = sum(summary.asked.values())
    assert len(timings) == asked and len({(t.judge, t.request_id) for t in timings}) == asked
    assert {t.runner for t in timings} == {"ray"} and all(t.node and t.actor for t in timings)
    assert {t.judge for t in timings} == set(summary.judges)


def test_a_lost_actor_has_its_batch_retried_nothing_lost_or_duplicated(
        cluster: Any, local_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kill -9`` of an actor's process while it edits a batch: Ray restarts the actor, the
    batch runs again there, and the records equal the local runner's."""
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    root = tmp_path / "ray"
    _copy_planned(local_run, root)
    # Each edit takes 20 ms, so a batch of 8 spends most of its time in the model.
    ctx = _configure(root, {"models": {MODEL: {"config": {"latency_seconds": 0.02}}},
                            "generate": {"runner": "ray"}, **ON_RAY})
    log = timings_path(root, "generate", MODEL)

    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = generate.run(ctx, MODEL)
        except BaseException as exc:  # reported by the assertion below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    killed = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and thread.is_alive():
        logged = read_timings(log)
        if len(logged) >= 24:  # three batches done: the actors are busy with the next ones
            killed = logged[-1].pid
            assert killed is not None
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.02)
    thread.join(timeout=300)
    assert killed is not None, "the run ended before an actor could be killed"
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    local_records = RecordStore(local_run / layout.generations_dir(MODEL), GenerationRecord)
    assert summary.complete and summary.status_counts == dict(
        Counter(r.status for r in local_records.load().values()))

    folder = layout.generations_dir(MODEL)
    assert _files(root / folder) == _files(local_run / folder)
    timings = read_timings(log)
    counts = Counter(t.request_id for t in timings)
    assert max(counts.values()) == 1, "a request was run twice"
    # The killed actor's restarted process finished batches (its actor id, a new pid).
    killed_actor = next(t.actor for t in timings if t.pid == killed)
    assert {t.pid for t in timings if t.actor == killed_actor} - {killed}
    # A record written just before the kill, whose timing line was not yet appended, is not
    # run again (so it has no line): at most the killed batch.
    assert len(timings) >= 400 - 8


def test_a_driver_killed_mid_run_resumes_on_rerun(cluster: Any, local_run: Path,
                                                  tmp_path: Path) -> None:
    """``kill -9`` of `acrb generate` running on Ray (its actors go with it), then a rerun:
    the records equal the local runner's."""
    root = tmp_path / "ray"
    _copy_planned(local_run, root)
    # latency_seconds is not part of the model's identity: the plan stays as it was.
    _configure(root, {"models": {MODEL: {"config": {"latency_seconds": 0.02}}},
                      "generate": {"runner": "ray"}, **ON_RAY})
    store = RecordStore(root / layout.generations_dir(MODEL), GenerationRecord)
    # The driver connects to this module's cluster, as a team's driver connects to theirs.
    env = {**os.environ, "ACRB_MLFLOW": "0",
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    command = [sys.executable, "-m", "acrb", "generate", "--model", MODEL]
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        if len(store.load(journals_only=True)) >= 40:
            break
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(store.load(journals_only=True))
    assert 40 <= done < 400, f"the kill landed at {done} records; expected mid-run"

    rerun = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    folder = layout.generations_dir(MODEL)
    assert _files(root / folder) == _files(local_run / folder)
    assert not (root / folder / JOURNAL_DIR).exists()
    counts = Counter(t.request_id for t in read_timings(timings_path(root, "generate", MODEL)))
    assert len(counts) >= 400 - 16 and max(counts.values()) == 1


def test_an_actor_that_cannot_load_its_model_stops_the_stage_with_the_cause(cluster: Any
                                                                           ) -> None:
    def broken() -> Any:
        raise RuntimeError("weights not found at /models/x")

    with pytest.raises(AcrbError, match=r"could not start: .*weights not found"):
        list(run_batches("ray", broken, [[1], [2]], desc="generate x",
                         ray_params=RayParams(actors=1, cpus_per_actor=0.5,
                                              start_timeout_seconds=60)))


def test_actors_that_do_not_fit_are_named_with_what_they_ask_for(cluster: Any) -> None:
    with pytest.raises(AcrbError, match=r"no Ray actor was placed.*asks for 0 GPU and 64 CPU"):
        list(run_batches("ray", dict, [[1]], desc="generate x",
                         ray_params=RayParams(actors=1, cpus_per_actor=64,
                                              start_timeout_seconds=3)))


@pytest.mark.parametrize(("params", "resources", "batches", "expected"), [
    (RayParams(), {"CPU": 16, "GPU": 4}, 100, (4, 1.0, 1.0)),          # one per GPU
    (RayParams(gpus_per_actor=0.5), {"CPU": 16, "GPU": 3}, 100, (6, 0.5, 1.0)),
    (RayParams(gpus_per_actor=0.3), {"CPU": 16, "GPU": 3}, 100, (10, 0.3, 1.0)),
    (RayParams(), {"CPU": 2}, 100, (2, 0.0, 1.0)),                     # no GPU: per CPU share
    (RayParams(cpus_per_actor=0.5), {"CPU": 2}, 100, (4, 0.0, 0.5)),
    (RayParams(actors=3), {"CPU": 2, "GPU": 8}, 100, (3, 1.0, 1.0)),   # as many as asked
    (RayParams(), {"CPU": 16, "GPU": 8}, 5, (5, 1.0, 1.0)),            # no more than batches
    (RayParams(cpus_per_actor=0), {"CPU": 2}, 100, (1, 0.0, 0.0)),
    (RayParams(), {"CPU": 0.5}, 100, (1, 0.0, 1.0)),                   # at least one
])
def test_actor_plan(params: RayParams, resources: dict[str, float], batches: int,
                    expected: tuple[int, float, float]) -> None:
    assert actor_plan(params, resources, batches) == expected


def test_runner_ray_without_ray_installed_says_how_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from acrb.errors import ConfigError

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"needs Ray.*\n?.*pip install"):
        list(run_batches("ray", dict, [[1]], desc="generate x", ray_params=RayParams()))
