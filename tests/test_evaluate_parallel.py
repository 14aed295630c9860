"""The evaluate stage in worker processes (``dvc repro`` runs it with every CPU): the same
records, byte for byte, as in one process, and an error raised in a worker arrives whole."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from acrb import layout
from acrb.errors import InputDataError
from acrb.records import GenerationRecord, read_table
from acrb.stages import evaluate
from acrb.stages.context import StageContext
from tests.conftest import one_model_project

MODEL = "synthetic-biased"


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_model_project(tmp_path_factory.mktemp("parallel") / "project", MODEL)


@pytest.fixture
def project(evaluated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    shutil.copytree(evaluated, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    # Two processes even for the tiny project's 400 requests, in small tasks.
    monkeypatch.setattr(evaluate, "PARALLEL_MIN", 1)
    monkeypatch.setattr(evaluate, "PARALLEL_CHUNK", 37)
    return root


def test_two_processes_write_the_records_of_one(project: Path, evaluated: Path,
                                                pools: list[int]) -> None:
    folder = layout.judgements_dir(MODEL)
    shutil.rmtree(project / folder)
    summary = evaluate.run(StageContext.load(project / "params.yaml", project), MODEL,
                           workers=2)
    assert summary.judged == 400 and summary.reused == 0 and pools == [2]
    for name in ("judgements.parquet", "records.jsonl"):
        assert (project / folder / name).read_bytes() == (evaluated / folder / name).read_bytes()


def test_an_error_in_a_worker_names_the_image_and_the_fix(project: Path,
                                                           pools: list[int]) -> None:
    generations = read_table(project / layout.generations_table(MODEL), GenerationRecord)
    edited = generations[generations["status"] == "ok"].iloc[-1]
    (project / edited["image_path"]).write_bytes(b"not the image generate wrote")
    shutil.rmtree(project / layout.judgements_dir(MODEL))
    with pytest.raises(InputDataError) as raised:
        evaluate.run(StageContext.load(project / "params.yaml", project), MODEL, workers=2)
    assert pools == [2] and edited["request_id"] in raised.value.problem
    assert raised.value.fix is not None and "dvc checkout" in raised.value.fix
