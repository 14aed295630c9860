"""The CLIP throughput benchmark's CPU path runs and writes every field the GPU figure needs.

``benchmarks/clip_throughput.py`` is loaded from its file and its ``main`` run with command-line
arguments (in this process: torch is imported once), with the tiny random-weight CLIP and a
handful of small images, so a change in the checker, the device preprocessing or the model
builder that would break the GPU measurement fails here first.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]


def test_cpu_run_writes_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACRB_MLFLOW", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.spec_from_file_location(
        "clip_throughput", REPO / "benchmarks" / "clip_throughput.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "clip_throughput.json"
    script.main(["--device", "cpu", "--architecture", "tiny", "--images", "5",
                 "--batch-size", "2", "--resolution", "96", "--single-images", "3",
                 "--processor-images", "4", "--out", str(out)])
    assert "[clip_throughput] batched:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["complete"] is True
    assert (result["images"], result["batch_size"], result["image_side_px"],
            result["device"]) == (5, 2, 96, "cpu")
    assert (result["one_at_a_time_images"], result["processor_path_images"]) == (3, 4)
    for rate in ("batched_images_per_s", "one_at_a_time_images_per_s",
                 "processor_path_images_per_s", "speedup", "speedup_over_processor_path"):
        assert result[rate] > 0, rate
    # Batching changes no score; the device path stays within the tolerance the detector
    # tests justify (tests/test_clip_refusal.py, SCORE_TOLERANCE).
    assert result["max_abs_score_difference"] < 1e-5
    assert result["max_abs_score_difference_vs_processor"] < 5e-3
    for key in ("device_name", "torch", "transformers", "python", "command"):
        assert result[key], key
    assert "--images 5" in result["command"]
    assert not list(tmp_path.glob("*.tmp"))
