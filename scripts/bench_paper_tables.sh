#!/usr/bin/env bash
# The paper's side-by-side benches (CPU, offline model, bfloat16, T=0, 256 new tokens), one dataset
# after another; each run resumes if interrupted. Settings: EAGLE-3 chain gamma 1 everywhere (the fastest
# EAGLE-3 shape on this CPU) kappa 2 for the SwitchSD / BanditSpec copy path and
# tau 0.3 for the SwitchSD gate, all chosen on a dev set of
# 16 prompts disjoint from these (HumanEval 150-157, MATH-500 dev 90-97; see docs/results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/paper}
METHODS=vanilla,pld,copyspec@chain1,eagle3@chain1,banditspec@chain1+k2,switchsd@chain1+k2+t0.3,oracle
for spec in humaneval:40 math500:40 cnndm:20; do
  ds=${spec%%:*}; n=${spec##*:}
  $PY -m switchsd bench --dataset "$ds" --limit "$n" --max-new-tokens 256 --dtype bfloat16 \
      --methods "$METHODS" --out "$OUT/$ds" "$@"
done
$PY -m switchsd analysis tax --results "$OUT"/{humaneval,math500,cnndm}/results.json | tee "$OUT/tax.md"
