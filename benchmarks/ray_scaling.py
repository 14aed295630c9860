"""Throughput of `generate` on the Ray runner with 1, 2 and 4 actors against the local runner,
and what Ray adds per request.

The model is the simulated editor ``synthetic:biased`` with ``latency_seconds`` set: it sleeps
that long per edit (``batch_size`` times that per batch) before painting, standing in for GPU
time that does not compete for the CPU. A small project is planned once (8 sources x 50
prompts = 400 requests, 128 px); then each configuration runs the real ``generate`` stage from
an empty generations folder, ``--repeats`` times, alternating configurations, and the median
wall time is kept:

- ``local``: ``generate.runner: local``, the stage's own process;
- ``ray-N``: ``generate.runner: ray`` with N actors of 2/N CPUs each (at most 1), on a local
  Ray cluster this script starts once, as a team's driver connects to a running cluster. The
  time includes starting the N actors (each loads the model) and shutting them down.

Reported per configuration: wall seconds, requests per second, speedup over local. Ray's added
cost per request is (wall of ray-1 - wall of local) / requests: the same work done in sequence
by one worker, through the actor instead of in process. The cluster's own start (``ray.init``)
is timed separately: it is paid once per stage when no cluster is running. Also timed: the
model's own CPU time per request (``latency_seconds: 0``, local), which bounds the speedup on
a machine with few cores. Usage::

    python benchmarks/ray_scaling.py [--latency 0.05] [--batch-size 8] [--actors 1 2 4]
        [--repeats 3] [--cpus 2] [--out benchmarks/results/ray_scaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MODEL = "synthetic-biased"


def plan_project(root: Path, latency: float, batch_size: int) -> None:
    """A project at ``root`` with ``MODEL`` only, 8 sources x 50 prompts, planned."""
    from acrb.stages import plan, prompts, sources
    from acrb.stages.context import StageContext

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sources"].update(races=["Black", "White"], genders=["Female", "Male"],
                             ages=["20s", "70plus"])
    params["prompts"]["catalog"] = str(REPO / "src/acrb/prompts/data/i2i_catalog.yaml")
    params["prompts"]["synthesis"] = None
    params["plan"]["arms"] = ["none"]
    params["plan"]["seeds"] = [0]
    params["winobias"] = None
    params["models"] = {MODEL: params["models"][MODEL]}
    params["models"][MODEL].setdefault("config", {})["latency_seconds"] = latency
    params["generate"]["batch_size"] = batch_size
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ctx = StageContext.load(root / "params.yaml", root)
    for stage in (sources, prompts, plan):
        stage.run(ctx)


def context(root: Path, runner: str, actors: int | None, cpus: float, latency: float) -> Any:
    from acrb.stages.context import StageContext

    ctx = StageContext.load(root / "params.yaml", root)
    data = ctx.params.model_dump()
    data["generate"]["runner"] = runner
    data["models"][MODEL]["config"]["latency_seconds"] = latency
    if actors is not None:
        data["ray"].update(actors=actors, cpus_per_actor=min(1.0, cpus / actors),
                           gpus_per_actor=0)
    params = type(ctx.params).model_validate(data)
    return StageContext(root=root, params=params, params_hash=ctx.params_hash)


def timed_run(ctx: Any) -> tuple[float, int]:
    """Seconds of one ``generate`` from an empty generations folder, and requests run."""
    from acrb import layout
    from acrb.stages import generate

    shutil.rmtree(ctx.path(layout.generations_dir(MODEL)), ignore_errors=True)
    shutil.rmtree(ctx.path("logs"), ignore_errors=True)
    tick = time.perf_counter()
    summary = generate.run(ctx, MODEL)
    seconds = time.perf_counter() - tick
    assert summary.complete, summary
    return seconds, summary.generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.05,
                        help="simulated model seconds per edit (default 0.05)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=float, default=2.0,
                        help="CPUs of the local Ray cluster (default 2, the CI machine's)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/ray_scaling.json")
    args = parser.parse_args()
    os.environ["ACRB_MLFLOW"] = "0"
    os.environ.setdefault("TQDM_DISABLE", "1")
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        plan_project(root, args.latency, args.batch_size)
        cpu_only = [timed_run(context(root, "local", None, args.cpus, 0.0))[0]
                    for _ in range(args.repeats)]
        starts = []
        for _ in range(args.repeats):
            tick = time.perf_counter()
            ray.init(num_cpus=int(args.cpus), include_dashboard=False, logging_level="WARNING")
            starts.append(time.perf_counter() - tick)
            ray.shutdown()
        ray.init(num_cpus=int(args.cpus), include_dashboard=False, logging_level="WARNING")
        configs: list[tuple[str, str, int | None]] = [("local", "local", None)] + [
            (f"ray-{n}", "ray", n) for n in args.actors]
        walls: dict[str, list[float]] = {name: [] for name, _, _ in configs}
        requests = 0
        for _ in range(args.repeats):
            for name, runner, actors in configs:
                seconds, requests = timed_run(context(root, runner, actors, args.cpus,
                                                      args.latency))
                walls[name].append(seconds)
                print(f"{name}: {seconds:.2f} s", file=sys.stderr)
        ray.shutdown()

    local = statistics.median(walls["local"])
    rows = []
    for name, _, actors in configs:
        wall = statistics.median(walls[name])
        rows.append({"config": name, "actors": actors, "wall_seconds": round(wall, 2),
                     "requests_per_second": round(requests / wall, 2),
                     "speedup_over_local": round(local / wall, 2),
                     "all_walls": [round(w, 2) for w in walls[name]]})
    added = None
    if "ray-1" in walls:
        added = (statistics.median(walls["ray-1"]) - local) / requests
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "ray_cluster_cpus": args.cpus,
                    "ray": ray.__version__},
        "requests": requests, "batch_size": args.batch_size,
        "latency_seconds_per_edit": args.latency,
        "model_time_per_run_seconds": round(requests * args.latency, 2),
        "cpu_seconds_per_request_without_latency": round(
            statistics.median(cpu_only) / requests, 4),
        "ray_init_seconds": round(statistics.median(starts), 2),
        "ray_added_seconds_per_request": None if added is None else round(added, 4),
        "rows": rows,
        "command": "python benchmarks/ray_scaling.py " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
