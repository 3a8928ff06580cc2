#!/usr/bin/env bash
# llama.cpp for bench_real_llm.py's peer rows: llama-cpp-python's source distribution, its vendored llama.cpp built
# once with cmake (the shared libraries, llama-quantize and llama-imatrix: about 10 minutes on 2 cores), and the
# Python bindings installed into the venv without building them again (they load the libraries built here).
#   benchmarks/install_llama_cpp.sh [DEST] [VENV]   -> prints the DIR to pass as --llama-cpp
set -euo pipefail
DEST=${1:-${TMPDIR:-/tmp}/llama-cpp}
VENV=${2:-.venv}
VERSION=0.3.36
mkdir -p "$DEST"
cd "$DEST"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
    "$OLDPWD/$VENV/bin/pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
    tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
LLAMA="$DEST/llama_cpp_python-$VERSION/vendor/llama.cpp"
# ggml's AMX matmul (compiled in by GGML_NATIVE on a CPU with AMX) crashed in llama_decode on an Intel Xeon VM with
# amx_int8: there, the same native ISA is named one extension at a time, AMX left out
ISA=(-DGGML_NATIVE=ON)
if grep -qw amx_int8 /proc/cpuinfo; then
    ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON
         -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
fi
cmake -S "$LLAMA" -B "$LLAMA/build" -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF "${ISA[@]}" -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$LLAMA/build" -j"$(nproc)" --target llama-quantize llama-imatrix > /dev/null
cd "$OLDPWD"
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VENV/bin/pip" install --quiet --no-deps "$DEST/llama_cpp_python-$VERSION"
"$VENV/bin/pip" install --quiet diskcache sentencepiece
LIB=$("$VENV/bin/python" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')")
mkdir -p "$LIB"
cp -P "$LLAMA"/build/bin/lib*.so* "$LIB"/
echo "$LLAMA"
