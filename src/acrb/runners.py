"""Where a stage's model calls run: in its own process (``local``) or on actors of a Ray cluster
(``ray``), with the same worker code and therefore the same records.

A stage hands :func:`run_batches` a *worker factory* and its batches. The factory builds the
worker, which loads the model (or judge) once; calling the worker with a batch runs the model on
it, writes each item's record atomically and returns one result per item. The local runner
builds one worker and feeds it every batch in order. The Ray runner builds one worker inside each
of several Ray actors (one per GPU by default: params ``ray``) and feeds them the same batches
through Ray's :class:`~ray.util.ActorPool`, each batch to whichever actor is free.

Why Ray Core actors and not Ray Data's actor pool: the work is a list of batches whose results
are files the worker writes itself, not a dataset to transform; an actor per GPU holding the
loaded model is exactly what is wanted, and Ray Core gives the fault tolerance needed (an actor
restarted after its process or node is lost, its batch in flight retried) with nothing between
the stage and the model but Ray's own pool. Ray Data would add a streaming executor, its own
batch formats and progress bars, and take the choice of batches (which must be the local
runner's, so a model whose output depends on its batch gives the same records) out of ACRB's
hands.

Lost workers: each actor is created with ``max_restarts`` and ``max_task_retries`` from params;
when its process dies (``kill -9``, out of memory, a node lost), Ray starts it again on any node
that fits and re-runs the batch it had in flight. A worker skips every item of a batch whose
record is already written (the rule a rerun uses), so a retried batch writes nothing twice. A
driver killed mid-run leaves the records written so far; the rerun skips them, whichever runner
wrote them.

Adapters and judges know nothing of this module: they are called by the worker exactly as in
the local runner.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from tqdm import tqdm

from acrb.config import RayParams, Runner
from acrb.errors import AcrbError, ConfigError

T = TypeVar("T")
R = TypeVar("R")


class BatchWorker(Protocol[T, R]):
    """Built once per process that runs a model: loads it; then called once per batch."""

    def __call__(self, batch: list[T]) -> list[R]:
        """Run the batch, write each item's record, return one result per item."""
        ...

    def close(self) -> None:
        """Release the model (called once, after the last batch)."""
        ...


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "runner `ray` needs Ray, which is not installed in this environment",
            "pip install 'ray>=2.40' (the project's `ray` extra: pip install -e '.[ray]'), or "
            "set generate.runner / judge.runner to local",
        ) from None
    return ray


def run_batches(runner: Runner, make_worker: Callable[[], BatchWorker[T, R]],
                batches: Sequence[list[T]], *, ray_params: RayParams, desc: str,
                unit: str = "req") -> Iterator[list[R]]:
    """The results of each batch of ``batches`` (one per item), as the batches finish: in order
    for the local runner, in order of completion for Ray. One progress bar counts the items of
    every worker."""
    total = sum(len(b) for b in batches)
    bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
    try:  # closed on an error too, so the bar ends its line before the error is printed
        if runner == "local":
            if not batches:
                return
            worker = make_worker()
            # A worker that can load the next batch's inputs ahead does so while it runs this
            # one (the generate stage's source images), so the model never waits on them.
            prepare = getattr(worker, "prepare", None)
            try:
                for index, batch in enumerate(batches):
                    if prepare is not None and index + 1 < len(batches):
                        prepare(batches[index + 1])
                    result = worker(batch)
                    bar.update(len(batch))
                    yield result
            finally:
                worker.close()
        elif runner == "ray":
            for result in _run_on_ray(make_worker, batches, ray_params, desc):
                bar.update(len(result))
                yield result
        else:  # pragma: no cover - the params type allows no other value
            raise ConfigError(f"unknown runner {runner!r}", "use local or ray")
    finally:
        bar.close()


class _Actor:
    """What each Ray actor holds: one worker, built (its model loaded) when the actor starts."""

    def __init__(self, make_worker: Callable[[], BatchWorker[Any, Any]]) -> None:
        self._worker = make_worker()

    def ready(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def run(self, batch: list[Any]) -> list[Any]:
        return self._worker(batch)

    def close(self) -> None:
        self._worker.close()


@contextmanager
def connected(params: RayParams) -> Iterator[Any]:
    """Ray, connected to the cluster of ``params.address`` (else ``RAY_ADDRESS``, else a local
    cluster started here and stopped on exit). A process already connected stays so."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    address = params.address or os.environ.get("RAY_ADDRESS") or None
    # On a running cluster, workers would start with the Python that ran `ray start`; the
    # actors must run this interpreter (a model with its own environment, models.<name>.python,
    # runs its stage there), found at the same path on every node.
    runtime_env = {"py_executable": sys.executable} if address else None
    try:
        ray.init(address=address, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=True, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"could not connect to the Ray cluster at {address}: {exc}",
            "start it (`ray start --head` on the head node) or fix ray.address / RAY_ADDRESS; "
            "leave both unset to start a local cluster",
        ) from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def actor_plan(params: RayParams, resources: dict[str, float], batches: int
               ) -> tuple[int, float, float]:
    """(actors, GPUs per actor, CPUs per actor) for a cluster with ``resources`` and a stage of
    ``batches`` batches: ``params.actors`` if set, else as many as the cluster fits; GPUs are
    asked for only when the cluster has some; never more actors than batches."""
    total_gpus = float(resources.get("GPU", 0.0))
    total_cpus = float(resources.get("CPU", 0.0))
    gpus = params.gpus_per_actor if total_gpus > 0 else 0.0
    cpus = params.cpus_per_actor
    if params.actors is not None:
        count = params.actors
    elif gpus > 0:
        count = math.floor(total_gpus / gpus + 1e-9)
    elif cpus > 0:
        count = math.floor(total_cpus / cpus + 1e-9)
    else:
        count = 1
    return max(1, min(count, batches)), gpus, cpus


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


def _run_on_ray(make_worker: Callable[[], BatchWorker[T, R]], batches: Sequence[list[T]],
                params: RayParams, desc: str) -> Iterator[list[R]]:
    if not batches:
        return
    with connected(params) as ray:
        from ray.util import ActorPool

        count, gpus, cpus = actor_plan(params, ray.cluster_resources(), len(batches))
        actor_class = ray.remote(_Actor).options(
            num_gpus=gpus, num_cpus=cpus, max_restarts=params.max_restarts,
            max_task_retries=params.max_restarts)
        actors = [actor_class.remote(make_worker) for _ in range(count)]
        try:
            ready = _wait_ready(ray, actors, params, gpus, cpus, desc)
            pool = ActorPool(ready)
            try:
                yield from pool.map_unordered(lambda actor, batch: actor.run.remote(batch),
                                              list(batches))
            except ray.exceptions.RayActorError as exc:
                raise AcrbError(
                    f"{desc}: a Ray actor was lost more than ray.max_restarts "
                    f"({params.max_restarts}) times: {_cause(exc)}",
                    "every request finished so far is recorded; rerun the stage to resume "
                    "(raise ray.max_restarts if nodes come and go)",
                ) from exc
            except ray.exceptions.RayTaskError as exc:
                raise AcrbError(f"{desc}: a batch failed on a Ray actor: {_cause(exc)}",
                                "every request finished so far is recorded; fix the cause and "
                                "rerun the stage to resume") from exc
            ray.get([actor.close.remote() for actor in ready])
        finally:
            for actor in actors:
                ray.kill(actor)


def _wait_ready(ray: Any, actors: list[Any], params: RayParams, gpus: float, cpus: float,
                desc: str) -> list[Any]:
    """The actors placed and holding a loaded model within ``params.start_timeout_seconds``.

    An actor whose model fails to load raises an AcrbError with the cause; when none is placed
    in time, an AcrbError names what each actor asks for and what the cluster has."""
    pending = {actor.ready.remote(): actor for actor in actors}
    ready: list[Any] = []
    deadline = time.monotonic() + params.start_timeout_seconds
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        done, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        for ref in done:
            actor = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                raise AcrbError(f"{desc}: a Ray actor could not start: {_cause(exc)}",
                                "the model or judge failed to load on the cluster (every node "
                                f"needs {sys.executable} and the project folder at the same "
                                "paths); see the error above") from exc
            ready.append(actor)
    if not ready:
        raise AcrbError(
            f"{desc}: no Ray actor was placed within {params.start_timeout_seconds:g} s; each "
            f"asks for {gpus:g} GPU and {cpus:g} CPU, the cluster has "
            f"{ray.cluster_resources()}",
            "lower ray.gpus_per_actor / ray.cpus_per_actor, add nodes, or raise "
            "ray.start_timeout_seconds",
        )
    if pending:
        tqdm.write(f"{desc}: {len(pending)} of {len(actors)} Ray actors were not placed within "
                   f"{params.start_timeout_seconds:g} s; running on {len(ready)}",
                   file=sys.stderr)
    return ready

