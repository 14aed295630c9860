"""Reproducing and sharing a run with DVC, as a team would, on a copy of the project with tiny
params (both slow: each needs a whole `dvc repro`, about two minutes on two cores).

- A rerun from scratch (every output removed) writes the same outputs: ``dvc.lock`` is the same
  byte for byte and ``dvc status`` is clean. The run's timings go to ``logs/timings``.
- An S3-compatible remote (moto's server, started here on a free local port with dummy keys):
  ``dvc push``, ``git clone`` to another folder, ``dvc pull``; there ``dvc repro`` runs
  nothing and ``dvc metrics show --json`` is the same.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port, stop
from tests.test_dvc_pipeline import BIN, _run, _stages_run, build_dvc_project

pytestmark = pytest.mark.slow

DVC = str(BIN / "dvc")


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The tiny project after one `dvc repro`, its outputs committed to git with the lock."""
    root, env = build_dvc_project(tmp_path_factory.mktemp("sharing") / "acrb")
    env = {**env, "ACRB_MLFLOW": "0"}  # the MLflow store is no DVC output; skip its cost
    _run([DVC, "repro"], root, env)
    _run(["git", "add", "-A"], root, env)
    _run(["git", "commit", "-qm", "a run"], root, env)
    return root, env


def test_a_rerun_from_scratch_reproduces_the_lock(reproduced: tuple[Path, dict[str, str]]
                                                  ) -> None:
    root, env = reproduced
    lock = (root / "dvc.lock").read_bytes()
    timings = root / "logs" / "timings" / "generate"
    assert sorted(p.name for p in timings.iterdir()) == [
        "synthetic-biased.jsonl", "synthetic-fair.jsonl", "synthetic-t2i.jsonl"]
    for folder in ("data", "metrics", "plots", "reports"):
        shutil.rmtree(root / folder)
    again = _run([DVC, "repro"], root, env)
    assert "generate@synthetic-fair" in _stages_run(again)
    if (root / "dvc.lock").read_bytes() != lock:
        diff = subprocess.run(["git", "diff", "--", "dvc.lock"], cwd=root, env=env,
                              capture_output=True, text=True).stdout
        pytest.fail(f"dvc.lock changed on a rerun from scratch:\n{diff[:4000]}")
    status = _run([DVC, "status"], root, env)
    assert "Data and pipelines are up to date" in status, status
    assert _run(["git", "status", "--porcelain"], root, env) == ""




@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """moto's S3 server on a free local port, with a bucket `acrb`; always stopped."""
    boto3 = pytest.importorskip("boto3")
    server = shutil.which("moto_server", path=str(BIN)) or shutil.which("moto_server")
    if server is None:
        pytest.skip("moto_server is not installed (pip install -e '.[dev]')")
    pytest.importorskip("dvc_s3")
    port = free_port()
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}
    log = (tmp_path / "moto.log").open("wb")
    process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                               stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="acrb")
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield endpoint, keys
    finally:
        stop(process)
        log.close()


def test_push_clone_pull_through_an_s3_remote(reproduced: tuple[Path, dict[str, str]],
                                              s3_server: tuple[str, dict[str, str]],
                                              tmp_path: Path) -> None:
    root, env = reproduced
    endpoint, keys = s3_server
    env = {**{k: v for k, v in env.items() if not k.startswith("AWS_")}, **keys}
    _run([DVC, "remote", "add", "-d", "s3remote", "s3://acrb/acrb"], root, env)
    _run([DVC, "remote", "modify", "s3remote", "endpointurl", endpoint], root, env)
    _run(["git", "commit", "-qam", "the team's remote"], root, env)
    pushed = _run([DVC, "push"], root, env)
    assert "pushed" in pushed, pushed
    metrics = json.loads(_run([DVC, "metrics", "show", "--json"], root, env))

    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    assert not (clone / "data" / "analysis").exists()  # git has only DVC's .gitignore files
    _run([DVC, "pull"], clone, env)
    assert (clone / "data" / "analysis").is_dir()
    again = _run([DVC, "repro"], clone, env)
    assert _stages_run(again) == set(), again
    assert "up to date" in _run([DVC, "status"], clone, env)
    assert json.loads(_run([DVC, "metrics", "show", "--json"], clone, env)) == \
        _relocated(metrics, root, clone)


def _relocated(value: object, root: Path, clone: Path) -> object:
    """``dvc metrics show --json`` keys results by workspace; a clone's are its own."""
    text = json.dumps(value).replace(str(root), str(clone))
    return json.loads(text)
