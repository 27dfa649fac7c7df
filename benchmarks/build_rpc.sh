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
#           (bin/ is a symlink to the CMake tree, kept in $LOCALINFER_CI_CACHE/rpc/KEY
#           as build_native.sh keeps its own: a fresh clone builds nothing again)
# Idempotent: builds only what is not built there yet (FORCE=1 rebuilds).
#
# Environment knobs: FORCE=1, JOBS=N (default 2), BENCH=1, PYTHON=..., LLAMA_CPP_PYTHON_SDIST=...,
# LOCALINFER_CI_CACHE=DIR (as in build_native.sh; the sdist and its unpacked source are shared with it).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=llama_cpp_source.sh
. "${HERE}/llama_cpp_source.sh"
TARGETS=(ggml-rpc-server)
if [[ "${BENCH:-0}" == "1" ]]; then TARGETS+=(llama-bench); fi

# The pip build's options (as build_native.sh), with the RPC backend on; no server, no UI.
CMAKE_OPTS=("${PIP_BUILD_CMAKE_OPTS[@]}" -DGGML_RPC=ON -DLLAMA_BUILD_SERVER=OFF)
cached_build build_rpc.sh rpc
mkdir -p "${HERE}/.build/rpc"
ln -sfn "${BUILD_DIR}/bin" "${HERE}/.build/rpc/bin"
echo "build_rpc.sh: done; ${TARGETS[*]} in ${HERE}/.build/rpc/bin -> ${BUILD_DIR}/bin"
