"""What every stage starts from: the project root, the validated params and their hash."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from acrb.config import DEFAULT_PARAMS, Params, load_params
from acrb.tracking import project_root


@dataclass(frozen=True)
class StageContext:
    root: Path
    params: Params
    params_hash: str

    @classmethod
    def load(cls, params_path: Path = DEFAULT_PARAMS, root: Path | None = None) -> StageContext:
        root = (root or project_root()).resolve()
        path = params_path if params_path.is_absolute() else root / params_path
        params, params_hash = load_params(path)
        return cls(root=root, params=params, params_hash=params_hash)

    def path(self, relative: Path | str) -> Path:
        """Absolute path of a project-relative path."""
        return self.root / relative

    @property
    def profile(self) -> str:
        return self.params.profile.name
