"""benchmarks/judge_throughput.py runs end to end on a tiny model on the CPU (the 7B-size run
needs a GPU and is a benchmark, not a test)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "judge_throughput.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("judge_throughput", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_every_batch_size_and_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "judge_throughput.json"
    load_script().main(["--tiny", "--device", "cpu", "--items", "3", "--single-items", "2",
                        "--batch-size", "2", "3", "--max-new-tokens", "8", "--image-size", "64",
                        "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["complete"] and result["skipped"] == []
    assert result["versions"]["transformers"] and result["attn_implementation"] == "sdpa_packed"
    single, two, three = result["runs"]
    assert [r["batch_size"] for r in result["runs"]] == [1, 2, 3]
    assert single["attention"]["vision_config"] == "acrb_packed_sdpa_flash_varlen"
    # Each item is asked and retried (random weights): 2 items alone make 4 calls; 3 items at
    # batch 2 make 2 + 2 calls (rows 2, 1, 2, 1), at batch 3 one call per round.
    assert single["generate_calls"] == 4 and single["rows_per_call"] == [1] * 4
    assert two["rows_per_call"] == [2, 1, 2, 1] and three["rows_per_call"] == [3, 3]
    for run in result["runs"]:
        assert run["statuses"] == {"scored": 0, "abstained": run["items"], "error": 0}
        assert run["items_per_s"] > 0
    assert two["speedup"] == pytest.approx(two["items_per_s"] / single["items_per_s"], abs=0.01)
    assert result["best"]["batch_size"] in (2, 3)


def test_a_spent_time_budget_skips_the_remaining_runs_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "judge_throughput.json"
    load_script().main(["--tiny", "--device", "cpu", "--single-items", "1", "--items", "2",
                        "--batch-size", "2", "--max-new-tokens", "8", "--image-size", "64",
                        "--time-budget", "0", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["batch_size"] for r in result["runs"]] == [1]
    assert result["skipped"][0]["batch_size"] == 2
    assert result["skipped"][0]["reason"].startswith("time budget")


def test_the_7b_size_refuses_a_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--device", "cpu"])
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
