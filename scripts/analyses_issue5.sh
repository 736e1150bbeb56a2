#!/usr/bin/env bash
# The SwitchSD issue's analyses on CPU (after scripts/bench_issue5.sh, which also writes the tax table):
#  - regime separation (Fig. 3) in float32, where SwitchSD must equal vanilla exactly (asserted per prompt),
#    with the paper's kappa 5 and with the kappa 2 the benches use;
#  - the temperature sweep (Table 4) + the T > 0 distribution check, in bfloat16 like the benches.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/issue5}
$PY -m switchsd.calibrate --dtype float32 | tail -1
for k in 5 2; do
  $PY -m switchsd.analysis regime --dataset humaneval --limit 12 --max-new-tokens 256 --kappa $k --chain --gamma 1 \
      --out "$OUT/regime-k$k" | tail -1
done
$PY -m switchsd.analysis temperature --dataset mtbench --limit 8 --max-new-tokens 128 --dtype bfloat16 \
    --methods vanilla,copyspec@chain1,eagle3@chain1,switchsd@chain1+k2 --dist-samples 100 \
    --out "$OUT/temperature" | tail -30
