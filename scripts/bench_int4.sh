#!/usr/bin/env bash
# The int4 bench: the offline model in its fastest format (`--dtype auto`: int4 where calibrated or uncalibrated
# on CPU) beside llama.cpp on the same GGUF and the transformers peers, defaults a user gets, 256 new tokens, one
# bench run per dataset (resumable). llama-cpp needs `pip install llama-cpp-python` (skipped with a message without).
#   scripts/bench_int4.sh
#   DTYPE=bfloat16 OUT=runs/int4-bench-bf16 scripts/bench_int4.sh     # the same rows in another format
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DTYPE=${DTYPE:-auto}
OUT=${OUT:-runs/int4-bench-$DTYPE}
METHODS=${METHODS:-llama-cpp,hf,hf-pld,vanilla,pld,eagle3,switchsd}
for spec in ${SETS:-humaneval:40 math500:40}; do
  ds=${spec%%:*}; n=${spec##*:}
  $PY -m switchsd bench --dataset "$ds" --limit "$n" --max-new-tokens 256 --dtype "$DTYPE" \
      --methods "$METHODS" --out "$OUT/$ds" "$@"
done
