#!/usr/bin/env bash
# The SwitchSD paper's Appendix B baselines (SAM-Decoding, Lookahead Decoding) beside the paper's methods and the
# transformers peers, defaults a user gets, 256 new tokens, one bench run per dataset (resumable).
#   scripts/bench_appendix_b.sh                  # defaults (bfloat16 on CPUs with native bf16)
#   DTYPE=float32 scripts/bench_appendix_b.sh    # float32: every method identical to vanilla on every prompt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DTYPE=${DTYPE:-auto}
OUT=${OUT:-runs/appendix-b-$DTYPE}
METHODS=${METHODS:-hf,hf-pld,vanilla,pld,copyspec,banditspec,eagle3,switchsd,samd,lookahead}
for spec in ${SETS:-humaneval:40 math500:40 cnndm:20}; do
  ds=${spec%%:*}; n=${spec##*:}
  $PY -m switchsd bench --dataset "$ds" --limit "$n" --max-new-tokens 256 --dtype "$DTYPE" \
      --methods "$METHODS" --out "$OUT/$ds" "$@"
done
