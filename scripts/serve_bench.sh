#!/usr/bin/env bash
# The serving runs behind docs/results.md "Serving": batched SD vs batched vanilla at batch 1/4/8/16,
# then PSD vs SD (equal-core and one-extra-core) at two offered loads. float32: outputs checked against
# single-request greedy decoding. Needs a quiet CPU (~20 min on 2 cores).
set -euo pipefail
OUT=${OUT:-runs/serve}
PY=${PY:-.venv/bin/python}
for B in 1 4 8 16; do
  $PY -m switchsd serve-bench --modes vanilla,sd --requests 16 --max-batch $B --max-new-tokens 64 \
      --dtype float32 --out $OUT/batch$B
done
for R in 0 1; do
  $PY -m switchsd serve-bench --modes vanilla,sps,sps-1core,psd --requests 16 --max-batch 4 --rate $R \
      --max-new-tokens 64 --dtype float32 --out $OUT/psd-rate$R
done
