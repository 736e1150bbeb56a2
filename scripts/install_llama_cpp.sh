#!/usr/bin/env bash
# The benchmark's optional llama-cpp peer: llama-cpp-python built from source into .venv (~10 min on 2 cores).
# AMX is left out: where a VM reports AMX (this project's machines), the native build crashes in its first decode.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_BMI2=ON \
-DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF}"
$PY -m pip install --no-cache-dir --no-deps "llama-cpp-python==0.3.36"
$PY -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
