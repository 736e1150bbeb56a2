#!/usr/bin/env bash
# The int4 bench: the offline model in its fastest format (`--dtype auto`: int4 where calibrated or uncalibrated
# on CPU) beside llama.cpp on the same GGUF and the transformers peers, defaults a user gets, 256 new tokens, one
# bench run per dataset (resumable). llama-cpp needs `pip install llama-cpp-python` (skipped with a message without).
#   scripts/bench_int4.sh
#   DTYPE=bfloat16 OUT=runs/int4-bench-bf16 scripts/bench_int4.sh     # the same rows in another format
#   DTYPE=q4q8 MAX_NEW=128 METHODS=llama-cpp,llama-cpp-pld,vanilla,pld,eagle3,switchsd \
#     SETS="humaneval:40 math500:40 cnndm:20 mtbench:20" scripts/bench_int4.sh      # the C forward beside llama.cpp
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DTYPE=${DTYPE:-auto}
OUT=${OUT:-runs/int4-bench-$DTYPE}
METHODS=${METHODS:-llama-cpp,hf,hf-pld,vanilla,pld,eagle3,switchsd}
MAX_NEW=${MAX_NEW:-256}
for spec in ${SETS:-humaneval:40 math500:40}; do
  ds=${spec%%:*}; n=${spec##*:}
  $PY -m switchsd bench --dataset "$ds" --limit "$n" --max-new-tokens "$MAX_NEW" --dtype "$DTYPE" \
      --methods "$METHODS" --out "$OUT/$ds" "$@"
done
