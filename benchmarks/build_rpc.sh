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

VERSION="0.3.36"
SDIST_NAME="llama_cpp_python-${VERSION}.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # as build_native.sh
TARGETS=(ggml-rpc-server)
if [[ "${BENCH:-0}" == "1" ]]; then TARGETS+=(llama-bench); fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${HERE}/.build"
SRC_ROOT="${OUT}/src"
LLAMA_SRC="${SRC_ROOT}/llama_cpp_python-${VERSION}/vendor/llama.cpp"
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
mkdir -p "${OUT}/sdist" "${SRC_ROOT}"

SDIST="${LLAMA_CPP_PYTHON_SDIST:-${OUT}/sdist/${SDIST_NAME}}"
if [[ ! -f "${SDIST}" ]]; then
    echo "build_rpc.sh: downloading ${SDIST_NAME} from PyPI"
    "${PYTHON}" -m pip download --no-binary :all: --no-deps "llama-cpp-python==${VERSION}" -d "${OUT}/sdist"
fi
echo "${SDIST_SHA256}  ${SDIST}" | sha256sum -c --quiet - \
    || { echo "build_rpc.sh: sha256 mismatch for ${SDIST}" >&2; exit 1; }
if [[ ! -f "${LLAMA_SRC}/CMakeLists.txt" ]]; then
    tar -xzf "${SDIST}" -C "${SRC_ROOT}"
fi

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
unset SOURCE_DATE_EPOCH  # as a plain pip build (it would turn GGML_NATIVE's default off)
# build_native.sh's options (the pip build's defaults), with the RPC backend on; no server, no UI.
CMAKE_OPTS=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_OPENMP=ON
    -DGGML_BACKEND_DL=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF
    -DGGML_RPC=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF
)
echo "build_rpc.sh: configuring ${CMAKE_DIR}"
cmake -S "${LLAMA_SRC}" -B "${CMAKE_DIR}" "${GEN[@]}" "${CMAKE_OPTS[@]}" >/dev/null
echo "build_rpc.sh: building ${TARGETS[*]} with -j${JOBS}"
cmake --build "${CMAKE_DIR}" --config Release -j "${JOBS}" --target "${TARGETS[@]}"
have_all || { echo "build_rpc.sh: build finished but binaries missing" >&2; exit 1; }
echo "build_rpc.sh: done; ${TARGETS[*]} in ${BIN}"
