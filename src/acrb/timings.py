"""How long each request took and where it ran: a log beside the pipeline, never one of its
outputs.

The per-request records are DVC outputs: their bytes make the hash ``dvc.lock`` records. A field
that differs between two runs of the same request (its seconds, the time it finished, the host
or GPU) would change the lock on every rerun, so that a rerun from scratch could not be told
from a different result. Those measurements are written here instead: one JSON line per
request, appended to ``logs/timings/<stage>/<model>.jsonl`` (git- and dvc-ignored, never a
stage's dependency). A batch's lines are appended in one ``write`` to a file opened with
``O_APPEND``, so shards that share the folder never interleave their lines, and a crash leaves
at most a torn last line, which :func:`read_timings` skips. Nothing the analysis reads comes
from this log; it is for people (how long did the run take, where did it run) and for
scheduling (seconds per request per node and GPU).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: Where the timing logs live, relative to the project root.
TIMINGS_DIR = Path("logs/timings")


class RequestTiming(BaseModel):
    """One request's model time and where it ran (one line of a timing log)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    stage: str = Field(description="the stage that ran the request, e.g. generate")
    model: str = Field(description="the model's entry name in params")
    status: str = Field(description="the request's outcome: ok, refused or error")
    seconds: float | None = Field(
        description="model time of the request: the adapter's own measure, else its batch's "
        "time over the batch's size; None when unknown")
    batch_size: int | None = Field(default=None, description="requests in its batch")
    finished_at: str = Field(description="ISO 8601 UTC time its batch finished; empty when "
                             "unknown")
    host: str = Field(default="", description="the machine's network name; empty when unknown")
    gpu: str = Field(default="", description="the CUDA device's name; empty on a CPU or when "
                     "unknown")
    peak_gpu_memory_mb: float | None = Field(
        default=None, description="peak GPU memory allocated while it ran, MiB")
    shard: str = Field(default="all", description="the --shard i/N that ran it, or all")
    pid: int | None = None
    judge: str = Field(default="", description="the judge's name (judge stage only)")
    runner: str = Field(default="local", description="local, or ray: run by a Ray actor")
    node: str = Field(default="", description="the Ray node's id; empty outside Ray")
    actor: str = Field(default="", description="the Ray actor's id; empty outside Ray")
    accelerators: str = Field(default="", description="the GPU ids Ray assigned the actor")
    origin: Literal["measured", "migrated"] = Field(
        default="measured", description="measured by this run, or moved here from a record "
        "written before records stopped carrying timings")


def timings_path(root: Path, stage: str, model: str) -> Path:
    """The timing log of ``stage`` for ``model`` under the project ``root``."""
    return root / TIMINGS_DIR / stage / f"{model}.jsonl"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def gpu_name() -> str:
    """The name of the CUDA device this process uses, if it has imported torch and has one.

    torch is never imported here: a process that did not load it runs no model on a GPU."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # a broken CUDA setup must not stop the stage over a log line
        return ""
    return ""


def host_name() -> str:
    return platform.node()


class Placement(TypedDict):
    """Which runner ran a request, and on Ray its node, actor and assigned GPUs."""

    runner: str
    node: str
    actor: str
    accelerators: str


def placement() -> Placement:
    """Where this process runs: the runner (``local`` or ``ray``) and, in a Ray actor, the
    node's and the actor's ids and the accelerators Ray assigned it. Ray is never imported
    here: a process that did not import it is no Ray worker."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            context = ray.get_runtime_context()
            actor = context.get_actor_id()
            if actor:
                gpus = context.get_accelerator_ids().get("GPU", [])
                return Placement(runner="ray", node=str(context.get_node_id()),
                                 actor=str(actor), accelerators=",".join(map(str, gpus)))
    except Exception:  # a log line must never stop the stage
        pass
    return Placement(runner="local", node="", actor="", accelerators="")


def here() -> dict[str, Any]:
    """Where this process runs, as a timing records it: host, GPU, process id and
    :func:`placement`. Constant for a worker once its model is loaded, so a worker reads it
    once rather than per request."""
    return {"host": host_name(), "gpu": gpu_name(), "pid": os.getpid(), **placement()}


def measured(where: dict[str, Any] | None = None, **fields: Any) -> RequestTiming:
    """The timing of a request run in this process: ``fields`` (request id, stage, model,
    status, seconds...) and where it ran (``where``, read by :func:`here` when not given)."""
    return RequestTiming.model_validate({**(here() if where is None else where), **fields})


def append_timings(path: Path, timings: Sequence[RequestTiming]) -> None:
    """Append ``timings`` to the log at ``path`` as JSON lines, in one ``O_APPEND`` write."""
    if not timings:
        return
    data = "".join(timing.model_dump_json() + "\n" for timing in timings).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it whole; the loop only guards a short write
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_timings(path: Path) -> list[RequestTiming]:
    """The timings logged at ``path``, oldest first; a line that is not a whole timing (the
    torn last line of a killed run) is skipped. A missing log reads as empty."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            found.append(RequestTiming.model_validate(json.loads(line)))
        except (ValueError, ValidationError):
            continue
    return found
