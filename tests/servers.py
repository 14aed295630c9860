"""Local servers a test (or a benchmark script) starts and always stops: a free port, waiting
until one answers, stopping it."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request

#: Environment for an `mlflow server` a test starts: MLflow 3 starts a job runner beside the
#: server by default (8 huey consumer processes and a periodic one, each importing MLflow:
#: about 20 s of CPU apiece, 2.5 minutes of the suite's CPU on two cores), for GenAI jobs
#: ACRB never submits. Telemetry off as well.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                     "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    """Return once ``url`` answers; raise RuntimeError if ``process`` exits first or nothing
    answers within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Terminate ``process`` (kill it if it does not exit within ``timeout``) and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
