#!/usr/bin/env bash
# The paper's analyses on CPU (after scripts/bench_paper_tables.sh, which also writes the tax table).
#   scripts/paper_analyses.sh temperature   Table 4 + the T > 0 distribution check, bfloat16 like the benches
#   scripts/paper_analyses.sh regime        Fig. 3 in float32, where SwitchSD must equal vanilla exactly (asserted
#                                            per prompt): the paper's gate (kappa 5, the probe's tau) and the
#                                            benches' gate (kappa 2, tau 0.3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/paper}
case "${1:-all}" in
  temperature|all)
    $PY -m switchsd analysis temperature --dataset mtbench --limit 4 --max-new-tokens 96 --dtype bfloat16 \
        --methods vanilla,copyspec@chain1,eagle3@chain1,switchsd@chain1+k2+t0.3 --dist-samples 60 \
        --out "$OUT/temperature" ;;&
  regime|all)
    $PY -m switchsd calibrate --dtype float32 | tail -1
    $PY -m switchsd analysis regime --dataset humaneval --limit 10 --max-new-tokens 256 --chain --gamma 1 \
        --out "$OUT/regime-k5" | tail -1
    $PY -m switchsd analysis regime --dataset humaneval --limit 10 --max-new-tokens 256 --chain --gamma 1 \
        --kappa 2 --tau 0.3 --out "$OUT/regime-k2-t0.3" | tail -1 ;;
esac
