"""A pipeline run logged to a local `mlflow server` whose artifacts live in S3 (moto).

The team setup: `mlflow server` with a SQLite backend and artifacts proxied to an S3 bucket
(served here by `moto_server` on a free port with dummy keys), `MLFLOW_TRACKING_URI` pointing
at it. The tiny pipeline's stages run against it and MlflowClient reads back the dotted params,
the datasets, the parent/child structure and an artifact. Both servers run on 127.0.0.1 and
are always stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import MLFLOW_SERVER_ENV, free_port, stop, wait_for
from tests.test_tracking_runs import run_tracked_stages, tracked_project

pytestmark = pytest.mark.slow  # two servers and one tracked tiny pipeline: ~1 min of CPU

BIN = Path(sys.executable).parent
BUCKET = "acrb-artifacts"
MODEL = "synthetic-biased"








@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A moto S3 server and an MLflow server proxying artifacts to it; yields the env a
    client needs (the tracking URI; the S3 keys are the server's business)."""
    for tool in ("moto_server", "mlflow"):
        if not (BIN / tool).exists():
            pytest.skip(f"{tool} is not installed (pip install 'moto[server,s3]' mlflow)")
    s3_port, mlflow_port = free_port(), free_port()
    s3_env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
              "AWS_DEFAULT_REGION": "us-east-1",
              "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}", **MLFLOW_SERVER_ENV}
    logs = tmp_path / "logs"
    logs.mkdir()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with (logs / "moto.log").open("wb") as out:
            moto = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p",
                                     str(s3_port)], stdout=out, stderr=subprocess.STDOUT,
                                    env=s3_env)
        processes.append(moto)
        wait_for(f"http://127.0.0.1:{s3_port}/", moto)
        import boto3

        boto3.client("s3", endpoint_url=s3_env["MLFLOW_S3_ENDPOINT_URL"],
                     aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        with (logs / "mlflow.log").open("wb") as out:
            mlflow_server = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                 str(mlflow_port), "--backend-store-uri",
                 f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
                 f"s3://{BUCKET}", "--workers", "1"],
                stdout=out, stderr=subprocess.STDOUT, env=s3_env)
        processes.append(mlflow_server)
        wait_for(f"http://127.0.0.1:{mlflow_port}/health", mlflow_server)
        yield {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
               "S3_ENDPOINT": s3_env["MLFLOW_S3_ENDPOINT_URL"]}
    finally:
        for process in reversed(processes):
            stop(process)


def test_a_pipeline_run_logged_to_a_tracking_server(
        server: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    import mlflow

    root = tracked_project(tmp_path / "project", (MODEL,))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server["MLFLOW_TRACKING_URI"])
    monkeypatch.delenv("ACRB_PIPELINE_RUN", raising=False)
    run_tracked_stages(root, (MODEL,))
    assert not (root / "mlflow.db").exists()  # nothing went to the local store

    client = mlflow.MlflowClient(server["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("acrb/embedded-default")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = next(r for name, r in runs.items() if name.startswith("pipeline"))
    assert parent.data.params["analyze.confidence"] == "0.95"
    assert parent.data.params[f"models.{MODEL}.key"] == "synthetic:biased"
    contexts = {t.value for item in parent.inputs.dataset_inputs for t in item.tags
                if t.key == "mlflow.data.context"}
    assert contexts == {"sources", "prompts", "plan"}
    assert all(item.dataset.digest for item in parent.inputs.dataset_inputs)
    children = [r for r in runs.values() if r is not parent]
    assert {"sources", "prompts", "plan", f"analyze/{MODEL}"} <= set(runs)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)

    analyze = runs[f"analyze/{MODEL}"]
    assert analyze.data.params["analyze.confidence"] == "0.95"
    local = client.download_artifacts(analyze.info.run_id, "metrics.csv", str(tmp_path))
    assert "delta_refusal" in Path(local).read_text()
    # The artifact is in the bucket, under the run's id (the server proxies it there).
    s3 = boto3.client("s3", endpoint_url=server["S3_ENDPOINT"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(analyze.info.run_id in k and k.endswith("/metrics.csv") for k in keys), keys[:5]
