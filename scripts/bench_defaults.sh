#!/usr/bin/env bash
# The default-settings tables: every method with the DEFAULTS a user gets (dtype auto, cost gate, EAGLE-3 shape
# auto, this device's calibrated curve) beside transformers' own generate (hf) and prompt lookup (hf-pld), the
# paper's fixed gate (switchsd-paper) and the oracle; one bench run per dataset, resumable.
#   scripts/bench_defaults.sh              # defaults (bfloat16 on CPUs with native bf16)
#   DTYPE=float32 scripts/bench_defaults.sh   # the float32 runs (identical to vanilla on every prompt)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DTYPE=${DTYPE:-auto}
OUT=${OUT:-runs/defaults-$DTYPE}
METHODS=${METHODS:-hf,hf-pld,vanilla,pld,copyspec,eagle3,switchsd,switchsd-paper,oracle}
# MT-Bench writing+roleplay only has the "never slower" bar (switchsd, eagle3 >= 0.97x vanilla): fewer rows
MT_METHODS=${MT_METHODS:-hf-pld,vanilla,pld,eagle3,switchsd,switchsd-paper}
for spec in ${SETS:-humaneval:40 math500:40 cnndm:20 mtbench:20}; do
  ds=${spec%%:*}; n=${spec##*:}
  extra=()
  methods=$METHODS
  if [ "$ds" = mtbench ]; then extra=(--category writing,roleplay); methods=$MT_METHODS; fi
  $PY -m switchsd bench --dataset "$ds" --limit "$n" --max-new-tokens 256 --dtype "$DTYPE" \
      --methods "$methods" --out "$OUT/$ds" "${extra[@]}" "$@"
done
