"""A sequential audit run by `dvc repro`, as a user runs it: the real dvc.yaml on a copy of the
project with a tiny sequential design.

Checks the promises of docs/sequential.md under DVC rather than stage by stage: a repeat of a
finished audit runs no stage and leaves every round's record as it was; an audit whose
`dvc repro` is killed (SIGKILL of the whole process group, DVC included, in the middle of an
editor's rounds) is resumed by the next `dvc repro` at its round, without deleting the rounds
already run (`generate`'s outputs persist), and ends with the same progress file and the same
stop as the uninterrupted audit.

The design is tests/test_sequential_audit.py's: 2 races x 20 sources, the 10 harmful-prompt
edits (20 requests a round), H6 declared, a budget of 10 rounds; the biased editor's planted
85-point refusal gap is decided within a few rounds, the fair editor spends the budget. The
fair editor takes 0.05 s an edit (one second a round, outputs unchanged) so that the kill
lands inside its rounds.

Slow (four `dvc repro`s of two tiny projects, about two minutes on two cores): one of the DVC
round trips CI runs after `make test` (`make test-ecosystem`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_dvc_pipeline import BIN, _run, _stages_run, build_dvc_project

FAIR, BIASED = "synthetic-fair", "synthetic-biased"
BUDGET, PER_ROUND = 10, 20
KILL_AT = 4  # the fair editor's round during which `dvc repro` is killed


def _sequential_project(root: Path) -> tuple[Path, dict[str, str]]:
    root, env = build_dvc_project(root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["models"] = {m: params["models"][m] for m in (FAIR, BIASED)}
    params["models"][FAIR]["config"]["latency_seconds"] = 0.05
    refusal = params["models"][BIASED]["config"]["refusal"]
    refusal["base"]["E"] = 0.05
    refusal["race"] = {"E": {"Black": 0.85}}
    params["sources"]["per_cell"] = 5
    params["prompts"].update(categories=["E"], synthesis=None)
    params["plan"].update(seeds=[0], sequential={
        "sources_per_round": 1, "alpha": 0.05, "margin": 0.05, "hypotheses": ["H6"],
        "dollars_per_request": 0.04, "max_rounds": BUDGET})
    params["judge"]["use"] = []
    params["analyze"]["hypotheses"] = {"H6": params["analyze"]["hypotheses"]["H6"]}
    params["analyze"].update(bootstrap=100, permutations=100)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    _run(["git", "commit", "-qam", "a sequential audit"], root, env)
    return root, {**env, "ACRB_MLFLOW": "0"}


def _progress_file(root: Path, model: str) -> Path:
    return root / "data" / "generations" / model / "sequential.json"


def _progress(root: Path, model: str) -> dict[str, Any] | None:
    try:  # written atomically: absent, or whole
        return json.loads(_progress_file(root, model).read_text())
    except FileNotFoundError:
        return None


def _kill_during_round(root: Path, env: dict[str, str], model: str, at: int) -> dict[str, Any]:
    """Start `dvc repro`, SIGKILL its whole process group once ``model``'s audit has begun
    round ``at``, and return the progress file the kill left."""
    process = subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=root, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and process.poll() is None:
            progress = _progress(root, model)
            if progress is not None and progress["included_rounds"] >= at:
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "dvc repro ended before it was killed"
    left = _progress(root, model)
    assert left is not None
    return left


@pytest.mark.slow
def test_a_sequential_audit_under_dvc_reruns_nothing_and_resumes_after_a_kill(
        tmp_path: Path) -> None:
    clean, env = _sequential_project(tmp_path / "clean")
    first = _run([str(BIN / "dvc"), "repro"], clean, env)
    assert {f"generate@{FAIR}", f"generate@{BIASED}", "analyze", "report"} <= _stages_run(first)
    fair, biased = _progress(clean, FAIR), _progress(clean, BIASED)
    assert fair is not None and biased is not None
    assert fair["finished"] and fair["stop"] == {**fair["stop"], "round": BUDGET,
                                                 "reason": "budget"}
    assert biased["finished"] and biased["stop"]["reason"] == "decided"
    assert 1 < biased["stop"]["round"] < BUDGET
    metrics = clean / "metrics" / "audit" / BIASED / "sequential.json"
    assert json.loads(metrics.read_text())["sequential.stop_round"] == biased["stop"]["round"]

    # A repeat of the finished audit: nothing to do, no record touched.
    recorded = {m: _progress_file(clean, m).read_bytes() for m in (FAIR, BIASED)}
    again = _run([str(BIN / "dvc"), "repro"], clean, env)
    assert _stages_run(again) == set(), again
    assert {m: _progress_file(clean, m).read_bytes() for m in (FAIR, BIASED)} == recorded

    # The same audit killed in the fair editor's rounds, then `dvc repro` again.
    killed, _ = _sequential_project(tmp_path / "killed")
    left = _kill_during_round(killed, env, FAIR, KILL_AT)
    assert not left["finished"] and KILL_AT <= left["included_rounds"] < BUDGET
    resumed = _run([str(BIN / "dvc"), "repro"], killed, env)
    assert f"generate@{FAIR}" in _stages_run(resumed)
    # The rounds the kill left were reused, not generated again: the resumed run's counts.
    line = re.search(rf"generate {FAIR}: (\d+) generated, (\d+) already done", resumed)
    assert line is not None, resumed
    assert int(line[2]) >= (KILL_AT - 1) * PER_ROUND
    assert int(line[1]) + int(line[2]) == BUDGET * PER_ROUND
    for model in (FAIR, BIASED):
        assert _progress_file(killed, model).read_bytes() == recorded[model], model
    assert (json.loads((killed / "metrics" / "audit" / FAIR / "sequential.json").read_text())
            == json.loads((clean / "metrics" / "audit" / FAIR / "sequential.json").read_text()))
    status = _run([str(BIN / "dvc"), "status"], killed, env)
    assert "up to date" in status, status
