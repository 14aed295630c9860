"""benchmarks/harness_overhead.py: its command line, its refusal to run without a GPU, and its
whole path on the CPU with the tiny Kontext pipeline against the committed params (so a change
elsewhere cannot break the GPU figure unseen); the measurement itself runs only on a CUDA
machine (marker ``gpu``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "harness_overhead.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("harness_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_names_the_options() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                            text=True, check=True, timeout=120)
    for option in ("--device", "--requests", "--batch-size", "--steps", "--resolution",
                   "--repeats", "--out"):
        assert option in result.stdout


def test_without_cuda_it_says_so_and_measures_nothing(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--device", "cpu"])
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_whole_path_runs_on_the_cpu_with_the_committed_params(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("diffusers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "overhead.json"
    result = load_script().main(["--tiny", "--requests", "2", "--batch-size", "2", "--steps",
                                 "1", "--resolution", "64", "--repeats", "1", "--out", str(out)])
    assert out.exists() and result["device"] == "cpu"
    assert result["acrb_images_per_second"] > 0 and result["bare_images_per_second"] > 0
    assert len(result["acrb_seconds"]) == len(result["bare_seconds"]) == 1
    assert "not a GPU figure" in result["model"]


@pytest.mark.gpu
def test_overhead_is_measured_on_a_gpu(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    out = tmp_path / "overhead.json"
    result = load_script().main(["--requests", "2", "--batch-size", "1", "--steps", "1",
                                 "--resolution", "512", "--repeats", "1", "--out", str(out)])
    assert out.exists() and result["acrb_images_per_second"] > 0
    assert result["bare_images_per_second"] > 0 and "overhead_percent" in result
