#!/usr/bin/env bash
# llama.cpp as its users run it: llama-server, llama-bench and llama-quantize built from the llama.cpp tree inside
# the llama-cpp-python 0.3.36 source distribution, static, into a cache folder outside the repository
# ($SWITCHSD_CACHE/llama.cpp, default ~/.cache/switchsd/llama.cpp). The instruction sets come from this CPU's flags,
# named explicitly (GGML_NATIVE=OFF): a native build on an AMX CPU compiles llama.cpp's AMX path, which faults in
# llama-server on these machines. LLAMA_CPP_AMX=1 also builds the native (AMX) variant beside it and keeps it only
# where a self-test (`python -m switchsd.eval.llama_server --self-test`, a server run in a subprocess) survives.
# Re-running is fast: a finished build is kept (delete the folder to rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
CACHE=${SWITCHSD_CACHE:-$HOME/.cache/switchsd}/llama.cpp
SRC=$CACHE/src
JOBS=${JOBS:-$(nproc)}
PY=${PY:-.venv/bin/python}
mkdir -p "$CACHE"

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "llama.cpp: downloading the llama-cpp-python $VERSION source distribution (its vendor/llama.cpp)"
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
  tar -xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp"
  rm -rf "$SRC"; mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"; rm -rf "$tmp"
fi

flags() {   # this CPU's instruction sets as llama.cpp's cmake options
  local f; f=$(grep -m1 '^flags' /proc/cpuinfo || true)
  local opts="-DGGML_NATIVE=OFF"
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
              avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
    grep -qw "${pair%%:*}" <<<"$f" && opts="$opts -DGGML_${pair##*:}=ON"
  done
  echo "$opts"
}

build() {   # build DIR CMAKE_OPTS...
  local dir=$1; shift
  if [ -x "$dir/bin/llama-server" ] && [ -x "$dir/bin/llama-bench" ] && [ -x "$dir/bin/llama-quantize" ]; then
    echo "llama.cpp: $dir is built"; return
  fi
  echo "llama.cpp: building into $dir ($*); about 10 minutes on 2 cores"
  local gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  command -v cmake >/dev/null 2>&1 || { echo "llama.cpp: cmake is missing (apt install cmake)"; exit 1; }
  cmake -S "$SRC" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF "$@" >"$dir.cmake.log" 2>&1 \
    || { tail -20 "$dir.cmake.log"; exit 1; }
  cmake --build "$dir" -j "$JOBS" --target llama-server llama-bench llama-quantize >"$dir.build.log" 2>&1 \
    || { tail -30 "$dir.build.log"; exit 1; }
}

build "$CACHE/build" $(flags)
ln -sfn build "$CACHE/active"
if [ "${LLAMA_CPP_AMX:-0}" = 1 ] && grep -qw amx_tile /proc/cpuinfo; then
  build "$CACHE/build-amx" -DGGML_NATIVE=ON
  if "$PY" -m switchsd.eval.llama_server --self-test --build "$CACHE/build-amx" 2>"$CACHE/amx-self-test.txt"; then
    ln -sfn build-amx "$CACHE/active"
  else
    echo "llama.cpp: the AMX build failed its server self-test ($(tail -1 "$CACHE/amx-self-test.txt" | cut -c1-80)...);"
    echo "           the benchmark uses the AVX-512 build (records say so)"
  fi
fi
"$CACHE/active/bin/llama-server" --version 2>&1 | head -2
echo "llama.cpp: $(readlink -f "$CACHE/active")/bin"
