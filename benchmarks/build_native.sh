#!/usr/bin/env bash
# Build the native llama.cpp reference tools (llama-bench, llama-batched-bench,
# llama-completion, llama-server) from the llama.cpp source vendored in the
# llama-cpp-python 0.3.36 sdist from PyPI, with the same CMake options that
# `pip install llama-cpp-python==0.3.36` uses by default on Linux/CPU, so the
# native numbers are comparable with what localinfer runs through the bindings.
#
# Output:   benchmarks/.build/bin/{llama-bench,llama-batched-bench,llama-completion,llama-server}
#           (a symlink to the CMake tree's bin/, which also holds the shared libs
#           libllama.so / libggml*.so the tools load)
#           benchmarks/.build/BUILD_INFO.txt  (what was built, how)
# The CMake tree is kept outside the checkout, in $LOCALINFER_CI_CACHE (default
# ~/.cache/localinfer-ci)/native/KEY, KEY a hash of all that decides the binaries
# (sdist, options, compilers, CPU flags: llama_cpp_source.sh's build_key): a
# fresh clone on the same machine builds nothing, only links bin/ to it.
# Idempotent: builds only the tools not yet built there (FORCE=1 rebuilds).
#
# Environment knobs:
#   FORCE=1                 rebuild even if the binaries exist
#   JOBS=N                  parallel compile jobs (default 2)
#   PYTHON=...              python used for `pip download` (default: python3)
#   LLAMA_CPP_PYTHON_SDIST=/path/llama_cpp_python-0.3.36.tar.gz
#                           use this tarball instead of downloading (sha256 still checked)
#   LOCALINFER_CI_CACHE=DIR where the sdist, its source and the CMake trees are kept
#
# The sdist, its pin and the pip build's CMake options: llama_cpp_source.sh.
# If llama-cpp-python was installed with custom CMAKE_ARGS, pass the same
# -D options via EXTRA_CMAKE_ARGS="..." here, or the comparison is not like-for-like.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=llama_cpp_source.sh
. "${HERE}/llama_cpp_source.sh"
TARGETS=(llama-bench llama-batched-bench llama-completion llama-server)
OUT="${HERE}/.build"

# shellcheck disable=SC2206
EXTRA=(${EXTRA_CMAKE_ARGS:-})
CMAKE_OPTS=(
    "${PIP_BUILD_CMAKE_OPTS[@]}"
    -DGGML_RPC=OFF
    -DLLAMA_BUILD_SERVER=ON   # llama-server: the reference for `localinfer serve` (serve_vs_native.py)
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF   # no web UI: no npm, no download from the Hub
    "${EXTRA[@]}"
)
cached_build build_native.sh native

if [[ "${BUILT}" == "1" || ! -f "${BUILD_DIR}/BUILD_INFO.txt" ]]; then
    {
        echo "llama-cpp-python sdist: ${SDIST_NAME} sha256=${SDIST_SHA256}"
        echo "cmake options: ${CMAKE_OPTS[*]}"
        echo "compiler: $(${CXX:-c++} --version | head -1)"
        echo "host: $(uname -srm); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
        grep -E '^(CMAKE_BUILD_TYPE|BUILD_SHARED_LIBS|GGML_NATIVE|GGML_OPENMP|GGML_LLAMAFILE|GGML_CPU_REPACK|GGML_AVX[A-Z0-9_]*|GGML_F16C|GGML_FMA|LLAMA_CURL|LLAMA_OPENSSL):' \
            "${BUILD_DIR}/CMakeCache.txt" || true
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${BUILD_DIR}"
    } > "${BUILD_DIR}/BUILD_INFO.txt"
fi
mkdir -p "${OUT}"
ln -sfn "${BUILD_DIR}/bin" "${OUT}/bin"
cp "${BUILD_DIR}/BUILD_INFO.txt" "${OUT}/BUILD_INFO.txt"
echo "build_native.sh: done; binaries in ${OUT}/bin -> ${BUILD_DIR}/bin"
