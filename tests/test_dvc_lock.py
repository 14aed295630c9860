"""The committed dvc.lock matches the committed code and params.

``dvc.lock`` records the md5 of every file a stage depends on. When code or params change and
the lock is not regenerated, ``dvc repro`` on a fresh clone re-runs those stages and their
results no longer say which code made them. DVC itself computes the hashes (``Repo.status``,
what ``dvc status`` prints); deps that are pipeline outputs are left out, since a fresh clone
has no ``data/`` (they come from ``dvc pull`` or a run), and so are the outputs themselves.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.dvc_deps import covered

FIX = "run `make repro` (or `dvc repro`), then commit dvc.lock"
#: What a copy of the project needs for DVC to compare its code with its lock.
PROJECT_PATHS = ["src", "inputs", "dvc.yaml", "dvc.lock", "params.yaml", ".dvcignore",
                 ".gitignore", ".dvc/config"]


def stale_dependencies(root: Path) -> dict[str, list[str]]:
    """Stage -> the code, data-file and params deps whose state differs from ``dvc.lock``
    (``path: modified``, ``params.yaml: analyze.confidence modified``, ``changed command``).

    Deps that are pipeline outputs, lie inside one or hold them (``data/generations``, the
    folder of every model's outputs) are not compared: they are the pipeline's own results."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        outputs = [str(out.def_path) for stage in repo.index.stages for out in stage.outs]
        status: dict[str, list[Any]] = repo.status()
    stale: dict[str, list[str]] = {}
    for stage, changes in status.items():
        found = []
        for change in changes:
            if isinstance(change, str):  # e.g. "always changed"
                found.append(change)
                continue
            for kind, detail in change.items():
                if kind == "changed outs":
                    continue
                if kind != "changed deps":
                    found.append(kind)
                    continue
                for path, state in detail.items():
                    if isinstance(state, dict):  # a params file: name -> state
                        found += [f"{path}: {name} {how}" for name, how in state.items()]
                    elif not _pipeline_output(path, outputs):
                        found.append(f"{path}: {state}")
        if found:
            # DVC names a stage relative to the working directory (`../x/dvc.yaml:plan`).
            stale[stage.rpartition("dvc.yaml:")[2]] = found
    return stale


def _pipeline_output(path: str, outputs: list[str]) -> bool:
    return covered(path, outputs) or any(covered(out, [path]) for out in outputs)


def describe(stale: dict[str, list[str]]) -> str:
    lines = [f"  {stage}: {'; '.join(found)}" for stage, found in sorted(stale.items())]
    return ("dvc.lock does not match the committed code and params in these stages:\n"
            + "\n".join(lines) + f"\nfix: {FIX}")


def test_the_committed_lock_matches_the_committed_code() -> None:
    if not (REPO / "dvc.lock").exists():
        pytest.skip("no dvc.lock in this checkout")
    stale = stale_dependencies(REPO)
    assert not stale, describe(stale)


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """The project's code, params and lock, with no data (as in a fresh clone), under git."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "acrb"
    for name in PROJECT_PATHS:
        source, target = REPO / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def _with(stale: dict[str, list[str]], path: str) -> set[str]:
    return {stage for stage, found in stale.items() if any(f.startswith(f"{path}:")
                                                           for f in found)}


def test_editing_code_a_stage_depends_on_names_the_stale_stages(project_copy: Path) -> None:
    before = stale_dependencies(project_copy)
    # Bytecode beside the code is dvc-ignored: it differs between Python versions and runs.
    cache = project_copy / "src" / "acrb" / "analysis" / "__pycache__"
    cache.mkdir()
    (cache / "report.cpython-311.pyc").write_bytes(b"\x00bytecode")
    assert stale_dependencies(project_copy) == before
    # An edit of a file most stages declare (one the lock still matches) makes each of them
    # stale, named with the file; the stages that do not use it stay as they were.
    candidates = ["src/acrb/demographics.py", "src/acrb/errors.py", "src/acrb/layout.py"]
    edited = next(path for path in candidates if not _with(before, path))
    dvc_yaml = yaml.safe_load((project_copy / "dvc.yaml").read_text())
    users = {name for name, stage in dvc_yaml["stages"].items()
             if edited in stage.get("deps", stage.get("do", {}).get("deps", []))}
    (project_copy / edited).write_text((project_copy / edited).read_text() + "\n# an edit\n")
    after = stale_dependencies(project_copy)
    named = _with(after, edited)
    assert {stage.partition("@")[0] for stage in named} == users and "report" in users
    assert all(f"{edited}: modified" in after[stage] for stage in named)
    message = describe(after)
    assert "  report: " in message and f"{edited}: modified" in message and FIX in message
    # A param a stage lists: only the stages that read it.
    params = yaml.safe_load((project_copy / "params.yaml").read_text())
    params["analyze"]["confidence"] = 0.5 if params["analyze"]["confidence"] != 0.5 else 0.6
    (project_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    changed = _with(stale_dependencies(project_copy), "params.yaml")
    assert "analyze" in changed and "sources" not in changed


def test_missing_pipeline_outputs_are_not_stale_code(project_copy: Path) -> None:
    # The copy has no data/: every stage's data deps are missing, none is named.
    stale = stale_dependencies(project_copy)
    assert not any(f.startswith(("data/", "plots/", "metrics/", "reports/"))
                   for found in stale.values() for f in found), describe(stale)
