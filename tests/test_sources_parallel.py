"""The sources stage's face search in worker processes (``dvc repro`` runs it with every CPU):
the same faces file, byte for byte, as in one process, and an error raised in a worker arrives
whole, with its fix."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from acrb import layout
from acrb.errors import AcrbError, ConfigError
from acrb.stages import sources
from acrb.stages.context import StageContext
from tests.conftest import update_params


def four_portraits(root: Path) -> StageContext:
    """The tiny project with one age: 2 races x 2 genders."""
    return update_params(root, lambda p: p["sources"].update(ages=["20s"]))


def outputs(root: Path) -> dict[str, bytes]:
    base = root / layout.SOURCES_DIR
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file()}


def no_cascade(image: np.ndarray) -> tuple[str, None]:
    """A face search in a worker whose OpenCV lacks the cascades (module level: it is sent to
    the worker by name)."""
    raise ConfigError("OpenCV's Haar cascade haarcascade_frontalface_default.xml is missing",
                      "install opencv-python-headless 4.x")


def worker_dies(image: np.ndarray) -> tuple[str, None]:
    """A worker killed mid-search (as by the kernel's out-of-memory killer)."""
    os._exit(9)


def test_workers_write_the_faces_file_of_one_process(project: Path, pools: list[int],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = four_portraits(project)
    sources.run(ctx, workers=1)
    alone = outputs(project)
    assert pools == [] and "faces.json" in alone
    # Four portraits are under the threshold: in two processes all the same.
    monkeypatch.setattr(sources, "PARALLEL_MIN", 1)
    monkeypatch.setattr(sources, "PARALLEL_QUEUED", 1)  # a worker waits on the next portrait
    sources.run(ctx, workers=2)
    assert pools == [2]
    assert outputs(project) == alone


def test_the_workers_come_from_the_environment_above_the_threshold(
    project: Path, pools: list[int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = four_portraits(project)
    monkeypatch.setenv("ACRB_SOURCES_WORKERS", "2")
    sources.run(ctx)  # 4 portraits, under PARALLEL_MIN: no pool to start
    assert pools == []
    monkeypatch.setattr(sources, "PARALLEL_MIN", 4)
    sources.run(ctx)
    assert pools == [2]
    monkeypatch.setenv("ACRB_SOURCES_WORKERS", "1")
    sources.run(ctx)
    assert pools == [2]
    monkeypatch.setenv("ACRB_SOURCES_WORKERS", "two")
    with pytest.raises(ConfigError, match="ACRB_SOURCES_WORKERS"):
        sources.run(ctx)


def test_an_error_in_a_worker_arrives_with_its_fix(project: Path, pools: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = four_portraits(project)
    sources.run(ctx, workers=1)
    before = outputs(project)
    monkeypatch.setattr(sources, "PARALLEL_MIN", 1)
    monkeypatch.setattr(sources, "faces_entry", no_cascade)
    with pytest.raises(ConfigError) as raised:
        sources.run(ctx, workers=2)
    assert pools == [2] and "haarcascade" in raised.value.problem
    assert raised.value.fix == "install opencv-python-headless 4.x"
    assert outputs(project) == before  # the staged outputs were not swapped in


def test_a_worker_that_dies_is_one_error_naming_the_fix(project: Path, pools: list[int],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = four_portraits(project)
    monkeypatch.setattr(sources, "PARALLEL_MIN", 1)
    monkeypatch.setattr(sources, "faces_entry", worker_dies)
    with pytest.raises(AcrbError) as raised:
        sources.run(ctx, workers=2)
    assert pools == [2] and "stopped abruptly" in raised.value.problem
    assert raised.value.fix is not None and "ACRB_SOURCES_WORKERS=1" in raised.value.fix
    assert not (project / layout.SOURCE_FACES).exists()
