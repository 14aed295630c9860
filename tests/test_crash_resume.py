"""kill -9 in the middle of `acrb generate`, then rerun: nothing lost, nothing duplicated, and
the result is identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from acrb import layout
from acrb.journal import JOURNAL_DIR, RECORDS_FILE, RecordStore
from acrb.records import GenerationRecord, read_table
from acrb.stages import plan, prompts, sources
from acrb.stages.context import StageContext
from acrb.storage import sha256_file
from tests.conftest import write_params

MODEL = "synthetic-biased"
SLOW = {"models": {MODEL: {"config": {"latency_seconds": 0.01}}}, "generate": {"batch_size": 8}}
COMPARED = ["request_id", "model", "status", "refusal_kind", "message", "image_sha256",
            "model_revision"]


def _prepare(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(root, SLOW)
    ctx = StageContext.load(root / "params.yaml", root)
    sources.run(ctx)
    prompts.run(ctx)
    plan.run(ctx)


def _generate(root: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ACRB_MLFLOW": "0"}
    return subprocess.Popen([sys.executable, "-m", "acrb", "generate", "--model", MODEL],
                            cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_sigkill_then_rerun_matches_uninterrupted_run(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")  # the in-process stages of _prepare too
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    _prepare(killed)
    _prepare(clean)
    store = RecordStore(killed / layout.generations_dir(MODEL), GenerationRecord)

    process = _generate(killed)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(store.load(journals_only=True)) >= 60:
            break
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    stored = store.load(journals_only=True)
    assert 60 <= len(stored) < 400, f"kill landed at {len(stored)} records; expected mid-run"
    # Every record stored describes a complete image: the record is written last.
    for record in stored.values():
        if record.image_path:
            assert sha256_file(killed / record.image_path) == record.image_sha256

    assert _generate(killed).wait(timeout=300) == 0
    assert _generate(clean).wait(timeout=300) == 0
    resumed = read_table(killed / layout.generations_table(MODEL), GenerationRecord)
    reference = read_table(clean / layout.generations_table(MODEL), GenerationRecord)
    assert len(resumed) == 400 and resumed["request_id"].is_unique
    pd.testing.assert_frame_equal(
        resumed[COMPARED].sort_values("request_id").reset_index(drop=True),
        reference[COMPARED].sort_values("request_id").reset_index(drop=True),
    )
    # The journal is folded away: the output holds the bytes an uninterrupted run writes.
    out = layout.generations_dir(MODEL)
    assert not (killed / out / JOURNAL_DIR).exists()
    assert (killed / out / RECORDS_FILE).read_bytes() == (clean / out / RECORDS_FILE).read_bytes()
    images = killed / layout.generations_dir(MODEL) / "images"
    assert not list(images.glob(".tmp-*")), "temporary files must be cleaned up on rerun"
    assert len(list(images.glob("*.png"))) == int((resumed["status"] == "ok").sum())
