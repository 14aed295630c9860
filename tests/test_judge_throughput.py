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


def test_tiny_run_writes_both_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "judge_throughput.json"
    load_script().main(["--tiny", "--device", "cpu", "--items", "3", "--batch-size", "2",
                        "--max-new-tokens", "8", "--image-size", "64", "--out", str(out)])
    result = json.loads(out.read_text())
    batched, single = result["runs"]
    assert (batched["batch_size"], single["batch_size"]) == (2, 1)
    # Three items, each asked and retried (random weights): 2 + 2 calls batched, 6 alone.
    assert batched["generate_calls"] == 4 and single["generate_calls"] == 6
    assert batched["statuses"] == single["statuses"] == {"scored": 0, "abstained": 3, "error": 0}
    assert batched["items_per_s"] > 0 and single["items_per_s"] > 0
    assert result["speedup"] == pytest.approx(batched["items_per_s"] / single["items_per_s"],
                                              abs=0.01)


def test_the_7b_size_refuses_a_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--device", "cpu"])
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
