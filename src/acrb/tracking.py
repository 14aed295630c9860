"""MLflow: the one place that knows run names, tags, the store location and artifacts.

The store is SQLite (MLflow's file store is in maintenance mode and refuses to start unless
told otherwise) at ``<project root>/mlflow.db``. The project root is resolved from the folder
that holds ``dvc.yaml``, and when a stage runs inside ``dvc exp run --queue``/``--temp`` (a
temporary copy under ``<root>/.dvc/tmp/exps/``) from the original project, so queued runs are not
logged into a folder that DVC deletes afterwards. ``MLFLOW_TRACKING_URI`` overrides all of this;
``ACRB_MLFLOW=0`` turns logging off (for quick experiments and some tests).

Layout: one experiment per profile (``acrb/<profile>``), one run per stage (and per model for
``generate``, ``evaluate`` and ``analyze``), tagged with the git commit, a dirty flag,
``DVC_EXP_NAME`` when set, the params hash and the stage.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from acrb.errors import AcrbError

EXPERIMENT_PREFIX = "acrb/"
_EXPS_MARKER = (".dvc", "tmp", "exps")


def project_root(start: Path | None = None) -> Path:
    """The project folder (holding dvc.yaml); outside any, ``start`` itself."""
    here = (start or Path.cwd()).resolve()
    parts = here.parts
    for i in range(len(parts) - len(_EXPS_MARKER) + 1):
        if parts[i : i + len(_EXPS_MARKER)] == _EXPS_MARKER:
            return Path(*parts[:i])
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists():
            return folder
    return here


def tracking_uri(start: Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at the project root (absolute path)."""
    configured = os.environ.get("MLFLOW_TRACKING_URI")
    if configured:
        return configured
    return f"sqlite:///{project_root(start) / 'mlflow.db'}"


def enabled() -> bool:
    return os.environ.get("ACRB_MLFLOW", "1").lower() not in ("0", "false", "off", "no")


def git_state(root: Path | None = None) -> dict[str, str]:
    """Commit hash and dirty flag of the project checkout ("unknown" outside git)."""
    cwd = root or project_root()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = "true" if git("status", "--porcelain", "--untracked-files=no") else "false"
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}
    return {"git_commit": commit, "git_dirty": dirty}


def experiment_name(profile: str) -> str:
    return EXPERIMENT_PREFIX + profile


def run_name(stage: str, model: str | None = None) -> str:
    return stage if model is None else f"{stage}/{model}"


class StageRun:
    """Handle on an active run; every method is a no-op when tracking is disabled."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.active:
            import mlflow

            flat = {k: str(v)[:6000] for k, v in params.items()}
            mlflow.log_params(flat)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Log many metrics in one batch call (one call per metric is ~100x slower)."""
        if not self.active or not metrics:
            return
        import mlflow

        clean = {k: float(v) for k, v in metrics.items() if v is not None and v == v}
        mlflow.log_metrics(clean)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if self.active and path.exists():
            import mlflow

            if path.is_dir():
                mlflow.log_artifacts(str(path), artifact_path)
            else:
                mlflow.log_artifact(str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.active:
            import mlflow

            mlflow.set_tags(dict(tags))


@contextmanager
def stage_run(stage: str, *, profile: str, params_hash: str, model: str | None = None,
              simulated: bool = False, extra_tags: Mapping[str, str] | None = None
              ) -> Iterator[StageRun]:
    """Open the MLflow run for one stage (and model); closes it as FAILED on an exception."""
    if not enabled():
        yield StageRun(active=False)
        return
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        import mlflow
    except ImportError as exc:  # pragma: no cover - mlflow is a core dependency
        raise AcrbError("mlflow is not installed",
                        "pip install -e . (or set ACRB_MLFLOW=0)") from exc
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment_name(profile))
    tags = {
        "acrb.stage": stage,
        "acrb.profile": profile,
        "acrb.params_hash": params_hash,
        "acrb.simulated": str(simulated).lower(),
        **{f"acrb.{k}": v for k, v in git_state().items()},
    }
    if model is not None:
        tags["acrb.model"] = model
    if os.environ.get("DVC_EXP_NAME"):
        tags["acrb.dvc_exp_name"] = os.environ["DVC_EXP_NAME"]
    tags.update(extra_tags or {})
    with mlflow.start_run(run_name=run_name(stage, model), tags=tags):
        yield StageRun(active=True)
