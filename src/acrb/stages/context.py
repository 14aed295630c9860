"""What every stage starts from: the stage root, the validated params and their hash.

The root is the folder DVC runs the stage in (:func:`acrb.tracking.stage_root`): inside
``dvc exp run --queue``/``--temp`` the experiment's own copy, so its params, inputs and outputs
are its own; only the MLflow store is the original project's (:func:`acrb.tracking.tracking_root`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from acrb import layout
from acrb.config import DEFAULT_PARAMS, Params, load_params
from acrb.errors import ConfigError, InputDataError
from acrb.records import RequestRecord, read_table
from acrb.tracking import stage_root


@dataclass(frozen=True)
class StageContext:
    root: Path
    params: Params
    params_hash: str

    @classmethod
    def load(cls, params_path: Path = DEFAULT_PARAMS, root: Path | None = None) -> StageContext:
        root = (root or stage_root()).resolve()
        path = params_path if params_path.is_absolute() else root / params_path
        params, params_hash = load_params(path)
        return cls(root=root, params=params, params_hash=params_hash)

    def path(self, relative: Path | str) -> Path:
        """Absolute path of a project-relative path."""
        return self.root / relative

    @property
    def profile(self) -> str:
        return self.params.profile.name

    def model_requests(self, model: str) -> pd.DataFrame:
        """The planned requests of the params entry ``model``, one row per request in plan
        order (columns of :class:`~acrb.records.RequestRecord`); in a sequential audit
        (``plan.sequential``) those of the rounds the editor has run so far.

        Raises an InputDataError if the plan has none, i.e. it predates the model's entry.
        """
        plan = read_table(self.path(layout.PLAN_TABLE), RequestRecord, validate=False)
        rows = plan[plan["model"] == model]
        if rows.empty:
            raise InputDataError(
                f"the plan has no requests for model '{model}'",
                "re-run `acrb plan` (or `dvc repro`) after adding the model to params.yaml",
            )
        rows = rows.reset_index(drop=True)
        sequential = self.params.plan.sequential
        if sequential is not None:
            # A sequential audit's editor: only the rounds it has run so far (acrb.rounds).
            from acrb.rounds import included_requests

            rows = included_requests(rows, self.root, model)
        return rows


def stage_workers(variable: str) -> int:
    """Processes a stage may use when it is its own process (as ``dvc repro`` runs it): the
    environment variable ``variable`` (e.g. ``ACRB_ANALYZE_WORKERS``) if set, else the CPUs
    this process may use. DVC runs one stage at a time, so the work inside a stage is what can
    use the other CPUs."""
    import os

    configured = os.environ.get(variable, "").strip()
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            raise ConfigError(f"{variable} is {configured!r}, not a number",
                              "set it to a whole number of processes, e.g. 2, or unset it"
                              ) from None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
