"""Throughput of a local VLM judge: batched generation against one item at a time.

A random-weight model of the published Qwen2.5-VL-7B-Instruct dimensions (below; nothing is
downloaded) with a locally built tokenizer and the real vision patch settings (14 px patches,
2 x 2 merge) judges the same items twice through the ``transformers-vlm`` chat backend and
:class:`~acrb.judges.vlm.VLMJudge`: once with ``batch_size`` conversations per ``generate`` call,
once with one. Each run starts from an empty reply cache; a warm-up call precedes the timing.
Random weights never answer in JSON, so every item also gets its one retry: both modes do the
same work, two generate rounds per item. Items/s, generate calls and peak memory are written
side by side to ``benchmarks/results/judge_throughput.json``.

    python benchmarks/judge_throughput.py --items 32 --batch-size 16        # on a CUDA GPU
    python benchmarks/judge_throughput.py --tiny --items 4 --batch-size 2   # CPU smoke run

The model is built in memory on the device in bfloat16 (float32 for ``--tiny`` on a CPU) and
handed to the backend instead of being written and read back (15 GB); everything else
(processor, chat template, batching, seeded greedy generation, the judge's retry) is the code
the judge stage runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tiny-checkpoint writer lives with the tests

from acrb.config import LLMBackendParams  # noqa: E402
from acrb.judges import JudgeItem  # noqa: E402
from acrb.judges.rubric import load_rubric  # noqa: E402
from acrb.judges.vlm import VLMJudge  # noqa: E402

RUBRIC = REPO / "src" / "acrb" / "judges" / "rubrics" / "acrb-v1.yaml"

#: Qwen2.5-VL-7B-Instruct's published config (text model and vision tower).
QWEN25_VL_7B_TEXT: dict[str, Any] = {
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
    "mrope_section": [16, 24, 24], "rms_norm_eps": 1e-6,
}
QWEN25_VL_7B_VISION: dict[str, Any] = {
    "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
    "hidden_act": "silu", "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
}
QWEN25_VL_7B_VOCAB = 152064


def make_items(count: int, size: int, seed: int = 0) -> list[JudgeItem]:
    """``count`` edit items with distinct random source and output images of ``size`` px."""
    rng = np.random.default_rng(seed)
    return [JudgeItem(f"bench-{i}", "make this person look 30 years older",
                      rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
                      source=rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
            for i in range(count)]


def peak_memory_gb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    # Linux reports kilobytes: the process's peak resident set, all runs included.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run_mode(folder: Path, model: Any, device: str, items: list[JudgeItem], batch_size: int,
             max_new_tokens: int) -> dict[str, Any]:
    import torch

    from acrb.clients.transformers_vlm import image_text_processor

    params = LLMBackendParams(kind="transformers-vlm", model=str(folder), device=device,
                              temperature=0.0, seed=1, max_tokens=max_new_tokens,
                              batch_size=batch_size)
    rubric = load_rubric(RUBRIC)
    with tempfile.TemporaryDirectory() as cache, VLMJudge("bench", params, rubric,
                                                         cache) as judge:
        client: Any = judge.client
        # The in-memory model stands in for from_pretrained; the rest is the backend's own path.
        processor = image_text_processor(str(folder), None)
        processor.tokenizer.padding_side = "left"
        client._processor, client._model, client._device = processor, model, device
        calls: list[int] = []
        original = client._request_batch

        def counted(batch: Any) -> Any:
            calls.append(len(batch))
            return original(batch)

        client._request_batch = counted
        # Warm-up on other images, so that nothing timed comes from the cache.
        judge.judge_many(make_items(1, items[0].output.shape[0], seed=1))
        calls.clear()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        answers = judge.judge_many(items)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {
        "mode": "batched" if batch_size > 1 else "one at a time",
        "batch_size": batch_size,
        "seconds": round(seconds, 3),
        "items_per_s": round(len(items) / seconds, 4),
        "generate_calls": len(calls),
        "statuses": {s: sum(a.status == s for a in answers) for s in ("scored", "abstained",
                                                                      "error")},
        "peak_memory_gb": round(peak_memory_gb(device), 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny random model instead of the 7B size (CPU smoke run)")
    parser.add_argument("--items", type=int, default=32, help="items judged per mode")
    parser.add_argument("--batch-size", type=int, default=16, help="batched mode's batch size")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="reply length cap")
    parser.add_argument("--image-size", type=int, default=448,
                        help="side of the square source and output images, px")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "judge_throughput.json")
    args = parser.parse_args(argv)

    import torch
    import transformers
    from tests.tiny_vlm import write_vlm

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.tiny and not device.startswith("cuda"):
        parser.error("the 7B-size model needs a CUDA GPU; use --tiny for a CPU run")
    side = args.image_size
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        size: dict[str, Any] = {} if args.tiny else {
            "text": QWEN25_VL_7B_TEXT, "vision": QWEN25_VL_7B_VISION,
            "vocab_size": QWEN25_VL_7B_VOCAB}
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        model = write_vlm(folder, "qwen2_5_vl", max_pixels=side * side, save_weights=False,
                          device=device, dtype=dtype, **size)
        parameters = sum(p.numel() for p in model.parameters())
        items = make_items(args.items, side)
        runs = [run_mode(folder, model, device, items, args.batch_size, args.max_new_tokens),
                run_mode(folder, model, device, items, 1, args.max_new_tokens)]
    result = {
        "benchmark": "judge_throughput",
        "model": "random-weight Qwen2.5-VL, " + ("tiny" if args.tiny else "7B dimensions"),
        "parameters": parameters,
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else
        platform.processor() or platform.machine(),
        "dtype": str(dtype).removeprefix("torch."),
        "items": args.items,
        "image_size": side,
        "max_new_tokens": args.max_new_tokens,
        "runs": runs,
        "speedup": round(runs[0]["items_per_s"] / runs[1]["items_per_s"], 2),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "command": "python benchmarks/judge_throughput.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for run in runs:
        print(f"{run['mode']:>14} (batch {run['batch_size']:>3}): {run['items_per_s']:8.3f} "
              f"items/s, {run['generate_calls']} generate calls, peak {run['peak_memory_gb']} GB")
    print(f"speedup {result['speedup']}x; written to {args.out}")
    return result


if __name__ == "__main__":
    main()
