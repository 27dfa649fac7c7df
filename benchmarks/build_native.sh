#!/usr/bin/env bash
# Build the native llama.cpp reference tools (llama-bench, llama-batched-bench,
# llama-completion, llama-server) from the llama.cpp source vendored in the
# llama-cpp-python 0.3.36 sdist from PyPI, with the same CMake options that
# `pip install llama-cpp-python==0.3.36` uses by default on Linux/CPU, so the
# native numbers are comparable with what localinfer runs through the bindings.
#
# Output:   benchmarks/.build/bin/{llama-bench,llama-batched-bench,llama-completion,llama-server}
#           (a symlink to benchmarks/.build/cmake/bin, which also holds the
#           shared libs libllama.so / libggml*.so the tools load)
#           benchmarks/.build/BUILD_INFO.txt  (what was built, how)
# Idempotent: exits early when the binaries already exist (FORCE=1 rebuilds);
# a build dir configured before llama-server was added only builds the server.
#
# Environment knobs:
#   FORCE=1                 rebuild even if the binaries exist
#   JOBS=N                  parallel compile jobs (default 2)
#   PYTHON=...              python used for `pip download` (default: python3)
#   LLAMA_CPP_PYTHON_SDIST=/path/llama_cpp_python-0.3.36.tar.gz
#                           use this tarball instead of downloading (sha256 still checked)
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
SRC_ROOT="${OUT}/src"
CMAKE_DIR="${OUT}/cmake"
BIN="${OUT}/bin"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"

have_all() {
    local t
    for t in "${TARGETS[@]}"; do
        [[ -x "${BIN}/${t}" ]] || return 1
    done
}

if [[ "${FORCE:-0}" != "1" ]] && have_all; then
    echo "build_native.sh: binaries already present in ${BIN} (FORCE=1 to rebuild)"
    exit 0
fi

command -v cmake >/dev/null || { echo "build_native.sh: cmake not found" >&2; exit 1; }

# 1. fetch the sdist, 2. unpack ------------------------------------------------
fetch_sdist "${OUT}" build_native.sh
unpack_sdist "${SRC_ROOT}" build_native.sh

# 3. configure ---------------------------------------------------------------
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
# ggml turns GGML_NATIVE's *default* off when SOURCE_DATE_EPOCH is set; we set
# it explicitly anyway, but keep the environment identical to a plain pip build.
unset SOURCE_DATE_EPOCH
CMAKE_OPTS=(
    "${PIP_BUILD_CMAKE_OPTS[@]}"
    -DGGML_RPC=OFF
    -DLLAMA_BUILD_SERVER=ON   # llama-server: the reference for `localinfer serve` (serve_vs_native.py)
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF   # no web UI: no npm, no download from the Hub
)
# shellcheck disable=SC2206
EXTRA=(${EXTRA_CMAKE_ARGS:-})
echo "build_native.sh: configuring ${CMAKE_DIR}"
cmake -S "${LLAMA_SRC}" -B "${CMAKE_DIR}" "${GEN[@]}" "${CMAKE_OPTS[@]}" "${EXTRA[@]}"

# 4. build only the reference tools --------------------------------------------
echo "build_native.sh: building ${TARGETS[*]} with -j${JOBS}"
cmake --build "${CMAKE_DIR}" --config Release -j "${JOBS}" --target "${TARGETS[@]}"

ln -sfn cmake/bin "${BIN}"
have_all || { echo "build_native.sh: build finished but binaries missing" >&2; exit 1; }

# 5. record what was built -----------------------------------------------------
{
    echo "llama-cpp-python sdist: ${SDIST_NAME} sha256=${SDIST_SHA256}"
    if [[ -d "${LLAMA_SRC}/.git" ]]; then
        echo "vendored llama.cpp commit: $(git -C "${LLAMA_SRC}" rev-parse HEAD 2>/dev/null || echo unknown)"
    fi
    echo "cmake options: ${CMAKE_OPTS[*]} ${EXTRA[*]:-}"
    echo "compiler: $(${CXX:-c++} --version | head -1)"
    echo "host: $(uname -srm); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    grep -E '^(CMAKE_BUILD_TYPE|BUILD_SHARED_LIBS|GGML_NATIVE|GGML_OPENMP|GGML_LLAMAFILE|GGML_CPU_REPACK|GGML_AVX[A-Z0-9_]*|GGML_F16C|GGML_FMA|LLAMA_CURL|LLAMA_OPENSSL):' \
        "${CMAKE_DIR}/CMakeCache.txt" || true
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "${OUT}/BUILD_INFO.txt"
echo "build_native.sh: done; binaries in ${BIN}"
