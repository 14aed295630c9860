"""Throughput of a local VLM judge: batched generation at several batch sizes against one at a time.

A random-weight model of the published Qwen2.5-VL-7B-Instruct dimensions (below; nothing is
downloaded) with a locally built tokenizer and the real vision patch settings (14 px patches,
2 x 2 merge, 112 px windows) judges edit items through the ``transformers-vlm`` chat backend and
:class:`~acrb.judges.vlm.VLMJudge`: first a few items one at a time (``--single-items``), then
``--items`` items at each batch size of ``--batch-size``. Each run starts from an empty reply
cache; a warm-up batch of other items precedes the timing (on an H200 a first batch-24 run took
2.7 times as long as a later one). Random weights never answer in JSON, so every item also
gets its one retry: every mode does the same work, two generate rounds per item. Items/s,
generate calls and peak memory of each run are written to
``benchmarks/results/judge_throughput.json`` after every run, so a run stopped by
``--time-budget`` (or killed) keeps what it measured.

    python benchmarks/judge_throughput.py --items 48 --batch-size 48 24 8   # on a CUDA GPU
    python benchmarks/judge_throughput.py --tiny --items 4 --batch-size 2   # CPU smoke run

The model is built in memory on the device in bfloat16 (float32 for ``--tiny`` on a CPU) and
handed to the backend instead of being written and read back (15 GB); everything else
(processor, chat template, pipelined batching, attention choice, seeded greedy generation, the
judge's retry) is the code the judge stage runs. On a GPU it also reports which SDPA kernels
accept the shapes the model runs (vision windows, whole images, text prefill with its padding
mask, one-token decode), the first of which in torch's priority order is the one that runs.
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


def sdpa_kernels(side: int, batch: int, device: str = "cuda") -> dict[str, Any]:
    """Which SDPA kernels accept the shapes of the 7B model at ``side`` px, by probing each
    kernel alone (``torch.nn.attention.sdpa_kernel``) with bfloat16 tensors on ``device``.

    ``runs`` is the first accepting kernel in torch's priority order: the one SDPA picks.
    Shapes: a vision window batch (16 windows of 64 patches, 16 heads of 80), a whole image
    (1 sequence of (side / 14) ** 2 patches), the text prefill of ``batch`` left-padded rows with
    their boolean mask (28 heads of 128; transformers repeats the 4 key/value heads when there is
    a mask) and one decode step.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    patches = (side // 14) ** 2
    prompt = 2 * patches // 4 + 400  # two images' tokens after the 2 x 2 merge, plus text
    cases: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool]] = {
        "vision_windows": ((16, 16, 64, 80), (16, 16, 64, 80), False),
        "vision_full_image": ((1, 16, patches, 80), (1, 16, patches, 80), False),
        "text_prefill_masked": ((batch, 28, prompt, 128), (batch, 28, prompt, 128), True),
        "text_decode_masked": ((batch, 28, 1, 128), (batch, 28, prompt, 128), True),
    }
    order = [SDPBackend(int(b)) for b in torch._C._get_sdp_priority_order()] \
        if hasattr(torch._C, "_get_sdp_priority_order") else \
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    order = [b for b in order if b != SDPBackend.OVERRIDEABLE]
    report: dict[str, Any] = {
        "enabled": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                    "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                    "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                    "math": torch.backends.cuda.math_sdp_enabled()},
        "priority": [b.name for b in order]}
    for name, (q_shape, kv_shape, masked) in cases.items():
        q = torch.randn(q_shape, device=device, dtype=torch.bfloat16)
        k = torch.randn(kv_shape, device=device, dtype=torch.bfloat16)
        mask = None
        if masked:
            mask = torch.ones(kv_shape[0], 1, q_shape[2], kv_shape[2], device=device,
                              dtype=torch.bool).tril(kv_shape[2] - q_shape[2])
            mask[0, :, :, :8] = False  # the first row is left padded
        accepted = []
        for backend in order:
            try:
                with sdpa_kernel([backend]):
                    torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
                accepted.append(backend.name)
            except RuntimeError:
                pass
        report[name] = {"accepted": accepted, "runs": accepted[0] if accepted else None}
        del q, k, mask
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return report


def estimated_seconds(runs: list[dict[str, Any]], batch_size: int, count: int) -> float | None:
    """A guess at the next run's length from the last one, or None before any run.

    Decoding is bound by per-step host work more than by rows, so a generate call is taken
    to cost the last run's seconds per call, times the fourth root of the batch growth (on an
    H200, 7B size: 1.5 to 1.8 s per call alone, 3.1 s at batch 8). The next run makes two calls per
    batch of items (question and retry) plus two for its warm-up batch.
    """
    if not runs:
        return None
    last = runs[-1]
    per_call = last["seconds"] / max(last["generate_calls"], 1)
    calls = 2 * -(-count // batch_size) + 2
    return calls * per_call * max(1.0, batch_size / last["batch_size"]) ** 0.25


def run_mode(folder: Path, model: Any, device: str, items: list[JudgeItem], batch_size: int,
             max_new_tokens: int, attn: str, cache: str) -> dict[str, Any]:
    import torch

    from acrb.clients.transformers_vlm import (
        apply_attention,
        attention_summary,
        image_text_processor,
    )

    params = LLMBackendParams(kind="transformers-vlm", model=str(folder), device=device,
                              temperature=0.0, seed=1, max_tokens=max_new_tokens,
                              batch_size=batch_size)
    rubric = load_rubric(RUBRIC)
    calls: list[int] = []
    original = model.generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(int(kwargs["input_ids"].shape[0]))
        return original(*args, **kwargs)

    model.generate = counted
    try:
        with tempfile.TemporaryDirectory() as cache_dir, VLMJudge("bench", params, rubric,
                                                                 cache_dir) as judge:
            client: Any = judge.client
            # The in-memory model stands in for from_pretrained; the rest is the backend's path.
            processor = image_text_processor(str(folder), None)
            processor.tokenizer.padding_side = "left"
            apply_attention(model, attn)
            client.attn_implementation, client.cache_implementation = attn, cache
            client._processor, client._model, client._device = processor, model, device
            # Warm-up with one full batch of other images (nothing timed comes from the
            # cache): the first call at a batch size grows the allocator's pool and picks
            # kernels for the new shapes, which costs a steady-state run nothing.
            judge.judge_many(make_items(min(batch_size, len(items)), items[0].output.shape[0],
                                        seed=1))
            calls.clear()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            answers = judge.judge_many(items)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
    finally:
        del model.generate
    return {
        "mode": "batched" if batch_size > 1 else "one at a time",
        "batch_size": batch_size,
        "items": len(items),
        "seconds": round(seconds, 3),
        "items_per_s": round(len(items) / seconds, 4),
        "generate_calls": len(calls),
        "rows_per_call": calls,
        "statuses": {s: sum(a.status == s for a in answers) for s in ("scored", "abstained",
                                                                      "error")},
        "peak_memory_gb": round(peak_memory_gb(device), 3),
        "attention": attention_summary(model),
        "cache_implementation": cache,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny random model instead of the 7B size (CPU smoke run)")
    parser.add_argument("--items", type=int, default=48, help="items judged per batched run")
    parser.add_argument("--single-items", type=int, default=4,
                        help="items judged one at a time (the baseline)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[48, 24, 8],
                        help="batched runs' batch sizes, each a run, in this order (largest "
                        "first, so a time budget drops the least useful)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="reply length cap")
    parser.add_argument("--image-size", type=int, default=448,
                        help="side of the square source and output images, px")
    parser.add_argument("--attn-implementation", default="sdpa_packed",
                        help="sdpa_packed (vision windows batched), sdpa or eager")
    parser.add_argument("--cache-implementation", default="dynamic",
                        choices=["dynamic", "static"], help="generate's KV cache")
    parser.add_argument("--time-budget", type=float, default=150.0,
                        help="seconds; a run whose estimated end passes it is skipped")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "judge_throughput.json")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    began = time.perf_counter()

    import torch
    import transformers
    from tests.tiny_vlm import write_vlm

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.tiny and not device.startswith("cuda"):
        parser.error("the 7B-size model needs a CUDA GPU; use --tiny for a CPU run")
    side = args.image_size
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    result: dict[str, Any] = {
        "benchmark": "judge_throughput",
        "complete": False,
        "model": "random-weight Qwen2.5-VL, " + ("tiny" if args.tiny else "7B dimensions"),
        "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else
        platform.processor() or platform.machine(),
        "dtype": str(dtype).removeprefix("torch."),
        "image_size": side,
        "max_new_tokens": args.max_new_tokens,
        "attn_implementation": args.attn_implementation,
        "cache_implementation": args.cache_implementation,
        "time_budget_s": args.time_budget,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "cuda": torch.version.cuda},
        "command": "python benchmarks/judge_throughput.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "runs": [],
        "skipped": [],
    }

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        tmp.replace(args.out)

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] {text}", flush=True)

    say(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
        f"{result['device']}, attention {args.attn_implementation}, KV cache "
        f"{args.cache_implementation}")
    if device.startswith("cuda"):
        result["sdpa"] = sdpa_kernels(side, max(args.batch_size))
        say("SDPA kernels (first accepting one runs): " + ", ".join(
            f"{case} {info['runs']}" for case, info in result["sdpa"].items()
            if isinstance(info, dict) and "runs" in info))
    write()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        size: dict[str, Any] = {} if args.tiny else {
            "text": QWEN25_VL_7B_TEXT, "vision": QWEN25_VL_7B_VISION,
            "vocab_size": QWEN25_VL_7B_VOCAB}
        model = write_vlm(folder, "qwen2_5_vl", max_pixels=side * side, save_weights=False,
                          device=device, dtype=dtype, **size)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        say(f"built {result['parameters'] / 1e9:.2f} B parameters")
        write()
        plan = [(1, args.single_items),
                *((b, args.items) for b in dict.fromkeys(args.batch_size) if b > 1)]
        for batch_size, count in plan:
            spent = time.perf_counter() - began
            estimate = estimated_seconds(result["runs"], batch_size, count)
            if estimate is not None and spent + estimate > args.time_budget:
                result["skipped"].append({"batch_size": batch_size, "items": count,
                                          "reason": f"time budget: {spent:.0f} s spent, about "
                                          f"{estimate:.0f} s more needed"})
                say(f"skipped batch {batch_size}: over the time budget")
                write()
                continue
            run = run_mode(folder, model, device, make_items(count, side), batch_size,
                           args.max_new_tokens, args.attn_implementation,
                           args.cache_implementation)
            result["runs"].append(run)
            single = result["runs"][0]["items_per_s"]
            run["speedup"] = round(run["items_per_s"] / single, 2)
            write()
            say(f"{run['mode']:>14} (batch {batch_size:>3}): {run['items_per_s']:8.3f} items/s "
                f"over {count} items, {run['generate_calls']} generate calls, peak "
                f"{run['peak_memory_gb']} GB, {run['speedup']}x")
    batched = [r for r in result["runs"] if r["batch_size"] > 1]
    if batched:
        best = max(batched, key=lambda r: r["items_per_s"])
        result["best"] = {"batch_size": best["batch_size"], "items_per_s": best["items_per_s"],
                          "speedup": best["speedup"]}
    result["complete"] = True
    result["seconds"] = round(time.perf_counter() - began, 1)
    write()
    say(f"done; written to {args.out}")
    return result


if __name__ == "__main__":
    main()
