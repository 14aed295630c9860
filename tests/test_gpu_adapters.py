"""benchmarks/gpu_adapters.py: its command line, its refusal to run without a GPU, its whole
path (subprocess per adapter, generate stage, JSON lines) on the CPU with the tests' tiny
pipelines, and the full-size builders' parameter counts against the published ones, counted
on the meta device so that nothing is allocated. The measurement itself runs only on a CUDA
machine (marker ``gpu``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_adapters.py"
#: Fields every finished adapter's JSON line carries.
FIELDS = {"adapter", "key", "mode", "status", "parameters", "parameters_by_component",
          "build_seconds", "peak_gpu_gib", "seconds_per_edit", "images_per_second",
          "seconds_per_step", "steps", "study_steps", "resolution", "batch_size", "requests",
          "wall_seconds"}


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_adapters", SCRIPT)
    assert spec is not None and spec.loader is not None
    if spec.name in sys.modules:
        return sys.modules[spec.name]
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the script is executed.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACRB_MLFLOW": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_help_names_the_options() -> None:
    result = run_script("--help", timeout=120)
    assert result.returncode == 0, result.stderr
    for option in ("--device", "--only", "--steps", "--requests", "--batch-size",
                   "--time-budget", "--adapter-timeout", "--tiny", "--out"):
        assert option in result.stdout


def test_without_cuda_it_says_so_and_measures_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "results.jsonl"
    result = run_script("--device", "cpu", "--out", str(out), timeout=120)
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr and "Nothing was measured" in result.stderr
    assert not out.exists()


def test_tiny_pipelines_run_through_the_generate_stage(tmp_path: Path) -> None:
    """Two adapters (an editor and a generator), each in its own subprocess, 2 steps on the
    CPU: one JSON line each with every field, and sane values."""
    for module in ("torch", "diffusers", "transformers", "tokenizers"):
        pytest.importorskip(module)
    out = tmp_path / "results.jsonl"
    result = run_script("--tiny", "--only", "instruct-pix2pix", "sd3.5-large", "--steps", "2",
                        "--requests", "2", "--out", str(out), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_lines(out)
    assert [r["adapter"] for r in records] == ["instruct-pix2pix", "sd3.5-large"]
    for record in records:
        assert set(record) >= FIELDS, FIELDS - set(record)
        assert record["status"] == "ok" and record["mode"] == "tiny"
        assert record["steps"] == 2 and record["requests"] == 2
        assert record["status_counts"] == {"ok": 2}
        assert record["parameters"] == sum(record["parameters_by_component"].values()) > 0
        assert record["seconds_per_edit"] > 0 and record["images_per_second"] > 0
        assert record["denoiser_calls"] == 2 * record["steps"]  # 2 edits, CFG in one call
        assert record["peak_gpu_gib"] is None  # a CPU run measures no GPU memory
        # 2 of the study's steps were run: the full-steps time is extrapolated, and says so.
        assert record["study_steps"] > 2
        assert record["extrapolated_seconds_per_edit_at_study_steps"] > record[
            "seconds_per_edit"]


def test_an_exhausted_time_budget_skips_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    result = run_script("--tiny", "--time-budget", "0", "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr
    records = read_lines(out)
    assert [r["adapter"] for r in records] == list(load_script().ADAPTERS)
    assert {r["status"] for r in records} == {"skipped"}


@pytest.mark.parametrize("name", ["instruct-pix2pix", "sd3.5-large", "flux-kontext",
                                  "qwen-image-edit-2511", "flux2-dev"])
def test_full_size_builders_have_the_published_parameter_counts(name: str) -> None:
    """Each builder's config numbers give the published model sizes (within 1%): built on the
    meta device, so the 56 B parameters of FLUX.2 [dev] cost no memory here."""
    for module in ("torch", "diffusers", "transformers", "tokenizers"):
        pytest.importorskip(module)
    import torch

    script = load_script()
    adapter = script.ADAPTERS[name]
    counts = script.count_parameters(adapter.components("meta", torch.bfloat16, script._stay))
    assert adapter.published, "every adapter names a published size to check"
    for component, (billions, source) in adapter.published.items():
        assert counts[component] / 1e9 == pytest.approx(billions, rel=0.01), source


@pytest.mark.gpu
def test_full_size_adapters_on_the_gpu(tmp_path: Path) -> None:
    """The real thing, smallest adapters first, 2 steps, within the default time budget."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "results.jsonl"
    result = run_script("--steps", "2", "--requests", "2", "--time-budget", "300",
                        "--out", str(out), timeout=400)
    records = read_lines(out)
    assert records, result.stdout[-3000:] + result.stderr[-3000:]
    first = records[0]
    assert first["adapter"] == "instruct-pix2pix" and first["status"] == "ok", first
    for record in records:
        if record["status"] == "ok" and record["mode"] == "full":
            assert record["peak_gpu_gib"] > 0 and record["seconds_per_step"] > 0
