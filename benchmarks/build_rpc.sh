#!/usr/bin/env bash
# Build llama.cpp's RPC server (ggml-rpc-server) from the llama.cpp vendored in the
# llama-cpp-python 0.3.36 sdist, with the pip build's CMake options plus -DGGML_RPC=ON:
# the same source as a llama-cpp-python built with CMAKE_ARGS="-DGGML_RPC=ON", so both
# speak the same RPC protocol version (a mismatch is refused at the handshake).
#
# CI (.ci/rpc) starts it on loopback ports: to llama.cpp it is a GPU device with its own
# memory, so every offload path of localinfer runs for real without a GPU.
#
# Output:   benchmarks/.build/rpc/bin/ggml-rpc-server (+ the libggml*.so it loads)
#           with BENCH=1 also benchmarks/.build/rpc/bin/llama-bench (for bench_rpc.py)
# Idempotent: exits early when the binaries exist (FORCE=1 rebuilds).
#
# Environment knobs: FORCE=1, JOBS=N (default 2), BENCH=1, PYTHON=..., LLAMA_CPP_PYTHON_SDIST=...
# (as in build_native.sh; the sdist and its unpacked source are shared with it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=llama_cpp_source.sh
. "${HERE}/llama_cpp_source.sh"
TARGETS=(ggml-rpc-server)
if [[ "${BENCH:-0}" == "1" ]]; then TARGETS+=(llama-bench); fi

OUT="${HERE}/.build"
SRC_ROOT="${OUT}/src"
CMAKE_DIR="${OUT}/rpc"
BIN="${CMAKE_DIR}/bin"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"

have_all() {
    local t
    for t in "${TARGETS[@]}"; do [[ -x "${BIN}/${t}" ]] || return 1; done
}
if [[ "${FORCE:-0}" != "1" ]] && have_all; then
    echo "build_rpc.sh: ${TARGETS[*]} already in ${BIN} (FORCE=1 to rebuild)"
    exit 0
fi
command -v cmake >/dev/null || { echo "build_rpc.sh: cmake not found" >&2; exit 1; }
fetch_sdist "${OUT}" build_rpc.sh
unpack_sdist "${SRC_ROOT}" build_rpc.sh

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
unset SOURCE_DATE_EPOCH  # as a plain pip build (it would turn GGML_NATIVE's default off)
# The pip build's options (as build_native.sh), with the RPC backend on; no server, no UI.
CMAKE_OPTS=("${PIP_BUILD_CMAKE_OPTS[@]}" -DGGML_RPC=ON -DLLAMA_BUILD_SERVER=OFF)
echo "build_rpc.sh: configuring ${CMAKE_DIR}"
cmake -S "${LLAMA_SRC}" -B "${CMAKE_DIR}" "${GEN[@]}" "${CMAKE_OPTS[@]}" >/dev/null
echo "build_rpc.sh: building ${TARGETS[*]} with -j${JOBS}"
cmake --build "${CMAKE_DIR}" --config Release -j "${JOBS}" --target "${TARGETS[@]}"
have_all || { echo "build_rpc.sh: build finished but binaries missing" >&2; exit 1; }
echo "build_rpc.sh: done; ${TARGETS[*]} in ${BIN}"
