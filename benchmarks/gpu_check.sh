#!/usr/bin/env bash
# The real NVIDIA check, for a machine with a GPU: llama-cpp-python built with -DGGML_CUDA=on and
# llama-bench from the very same CMake tree (so the same libggml-cuda), then `run`, `bench` and
# `batch` with every layer on the GPU, our decode and prefill against llama-bench's as ratios
# (benchmarks/offload_vs_llama_bench.py; floor: bench >= 0.95 x llama-bench).
#
#   benchmarks/gpu_check.sh          # NVIDIA GPU, driver and CUDA toolkit (nvcc) present
#   benchmarks/gpu_check.sh --cpu    # dry run without CUDA: the same steps with a CPU build, and
#                                    # the check expects no layer offloaded instead of all
#
# Output: benchmarks/.build/gpu-check-{cuda,cpu}/ (wheel, CMake tree, venv) and report.txt there.
# Knobs: JOBS (default: all cores), ROUNDS (3), CUDA_ARCH (default "native": only this GPU's).
set -euo pipefail
MODE=cuda
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "${HERE}")"
# shellcheck source=llama_cpp_source.sh
. "${HERE}/llama_cpp_source.sh"
OUT="${HERE}/.build/gpu-check-${MODE}"
JOBS="${JOBS:-$(nproc)}"
t0=$SECONDS

# llama.cpp's tools are built in the wheel's own CMake tree, so llama-bench links the very libraries
# the wheel ships, and CUDA is compiled once. The tools add tools/mtmd themselves, so the wheel's own
# copy of it is off (LLAVA_BUILD: the multimodal library, which localinfer does not load). A CPU
# build is what a missing GPU falls back to, so the dry run proves every step.
ARGS="-DLLAMA_BUILD_TOOLS=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"
if [[ "${MODE}" == cuda ]]; then
    command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu_check.sh: no NVIDIA GPU (nvidia-smi); --cpu for a dry run" >&2; exit 1; }
    command -v nvcc >/dev/null || { echo "gpu_check.sh: no CUDA toolkit (nvcc)" >&2; exit 1; }
    ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-native} ${ARGS}"
fi

fetch_sdist gpu_check.sh  # the sdist the native builds pin, sha256 checked
mkdir -p "${OUT}/wheels"
if ! ls "${OUT}"/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "gpu_check.sh: building llama-cpp-python with CMAKE_ARGS=\"${ARGS}\" (-j${JOBS})"
    CMAKE_ARGS="${ARGS}" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS}" python3 -m pip wheel -q --no-cache-dir --no-deps \
        -C build-dir="${OUT}/cmake" -w "${OUT}/wheels" "${SDIST}"
fi
BENCH="$(find "${OUT}/cmake" -type f -name llama-bench -perm -u+x | head -n 1)"
[[ -n "${BENCH}" ]] || { echo "gpu_check.sh: llama-bench missing from ${OUT}/cmake (FORCE: rm -r ${OUT})" >&2; exit 1; }
t_build=$((SECONDS - t0))

python3 -m venv "${OUT}/venv"
"${OUT}/venv/bin/python" -m pip install -q --upgrade pip
"${OUT}/venv/bin/python" -m pip install -q --force-reinstall --no-deps "$(ls "${OUT}"/wheels/llama_cpp_python-*.whl | head -n 1)"
"${OUT}/venv/bin/python" -m pip install -q -e "${ROOT}[test]"
cd "${ROOT}"
"${OUT}/venv/bin/python" -m localinfer doctor | tee "${OUT}/report.txt"
echo >> "${OUT}/report.txt"
EXPECT=all
if [[ "${MODE}" == cpu ]]; then EXPECT=none; fi
set +e
"${OUT}/venv/bin/python" "${HERE}/offload_vs_llama_bench.py" --python "${OUT}/venv/bin/python" --llama-bench "${BENCH}" \
    --ngl 99 --rounds "${ROUNDS:-3}" --run --batch --expect-layers "${EXPECT}" | tee -a "${OUT}/report.txt"
rc=${PIPESTATUS[0]}
set -e
echo "gpu_check.sh (${MODE}): build ${t_build}s, in all $((SECONDS - t0))s; report in ${OUT}/report.txt" | tee -a "${OUT}/report.txt"
exit "${rc}"
