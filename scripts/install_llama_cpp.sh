#!/usr/bin/env bash
# The benchmark's optional llama.cpp peers: llama-cpp-python built from source into .venv for this machine's CPU
# (GGML_NATIVE: -march=native, 10-15 min on 2 cores). AMX is left out: where a VM reports AMX (this project's
# machines), the native build crashes in its first decode. diskcache: llama_cpp imports it (installed --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF}"
$PY -m pip install --no-cache-dir --no-deps "llama-cpp-python==0.3.36" diskcache
$PY -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
