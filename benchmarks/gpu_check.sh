#!/usr/bin/env bash
# The GPU figures of ACRB in one or two commands on one CUDA machine: harness overhead of the
# generate stage (FLUX.1 Kontext at full size), in-process VLM judge throughput (Qwen2.5-VL-7B
# dimensions), the CLIP refusal layer at 1024 px, and every diffusers adapter at full size.
# Random weights throughout (nothing is downloaded); each part is bounded in time and writes
# its results as it goes, so a part that fails or runs out of time keeps what it measured and
# the next part still runs.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [first|adapters|all]
#   GPU_CHECK_DRY_RUN=1 bash benchmarks/gpu_check.sh OUT_DIR all   # print the commands only
#
# `first` (about 6 minutes on one H200): environment, harness overhead, judge, CLIP.
# `adapters` (about 5 minutes): benchmarks/gpu_adapters.py. `all`: both (about 11 minutes).
# Run from the repository root with the project's dependencies importable (PYTHONPATH=src is
# set here); benchmarks/README.md says how to bring the missing packages to a machine without
# network. Copy the figures into benchmarks/results/ with the command, card and versions.
set -u
OUT_DIR=${1:?usage: gpu_check.sh OUT_DIR [first|adapters|all]}
PART=${2:-all}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" ACRB_MLFLOW=0 HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

part() {  # part NAME SECONDS COMMAND...: run one bounded part, logging its status
    local name=$1 seconds=$2
    shift 2
    echo "== $name (at most ${seconds}s): $*"
    if [[ -n ${GPU_CHECK_DRY_RUN:-} ]]; then  # list the commands only (the tests check them)
        return
    fi
    local start=$SECONDS
    timeout --kill-after=10 "$seconds" "$@"
    echo "== $name: exit $? after $((SECONDS - start))s"
}

environment() {
    "$PYTHON" - "$OUT_DIR/environment.json" <<'EOF'
import json, platform, subprocess, sys
from importlib import metadata
info = {"python": platform.python_version(), "machine": platform.machine()}
for name in ("torch", "transformers", "diffusers", "pydantic", "tokenizers", "accelerate",
             "torchvision", "numpy", "pillow"):
    try:
        info[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        info[name] = None
import torch
info["cuda"] = torch.version.cuda
info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
info["gpu_memory_gib"] = (round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                          if torch.cuda.is_available() else None)
try:
    info["driver"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip()
except (OSError, subprocess.SubprocessError):
    info["driver"] = None
info["cpu_count"] = __import__("os").cpu_count()
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(json.dumps(info))
EOF
}

if [[ $PART == first || $PART == all ]]; then
    part environment 30 environment
    part harness_overhead 270 "$PYTHON" benchmarks/harness_overhead.py --device cuda \
        --requests 12 --batch-size 2 --steps 4 --resolution 1024 --repeats 3 \
        --profile "$OUT_DIR/harness_profile.txt" --out "$OUT_DIR/harness_overhead.json"
    part judge_throughput 170 "$PYTHON" benchmarks/judge_throughput.py --device cuda \
        --items 48 --single-items 4 --batch-size 48 24 8 --max-new-tokens 64 \
        --image-size 448 --time-budget 140 --out "$OUT_DIR/judge_throughput.json"
    part clip_throughput 90 "$PYTHON" benchmarks/clip_throughput.py --device cuda \
        --images 256 --batch-size 64 --resolution 1024 --out "$OUT_DIR/clip_throughput.json"
fi
if [[ $PART == adapters || $PART == all ]]; then
    # 4 denoising steps, not each study's 28-50: seconds per step are measured, and the time of
    # an edit at the study's steps is extrapolated from them (and labelled so).
    part gpu_adapters 330 "$PYTHON" benchmarks/gpu_adapters.py --device cuda --steps 4 \
        --requests 2 --batch-size 1 --time-budget 300 --out "$OUT_DIR/gpu_adapters.jsonl"
fi
