# shellcheck shell=bash
# The llama.cpp every native build here starts from: the one vendored in the llama-cpp-python sdist
# that localinfer runs, pinned once for build_native.sh, build_rpc.sh, gpu_check.sh and .ci/rpc
# (sourced by them), and the CMake options of that sdist's default `pip install` on Linux/CPU.

LLAMA_CPP_PYTHON_VERSION="0.3.36"
SDIST_NAME="llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}.tar.gz"
# sha256 of the PyPI sdist (PyPI files are immutable; pinned for reproducibility)
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# Options mirrored from the llama-cpp-python default build (its CMakeLists.txt + scikit-build-core
# defaults; confirmed against the CMakeCache of a real `pip install`): Release (-O3 -DNDEBUG), shared
# libraries, GGML_NATIVE=ON (-march=native; pip does not set SOURCE_DATE_EPOCH, so ggml's default
# stays ON), OpenMP, llamafile and CPU repacking at their defaults (ON), no GPU backend, no curl.
PIP_BUILD_CMAKE_OPTS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DGGML_NATIVE=ON
    -DGGML_OPENMP=ON
    -DGGML_BACKEND_DL=OFF
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF
    -DGGML_HIP=OFF -DGGML_SYCL=OFF -DGGML_OPENCL=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TESTS=OFF
)

# fetch_sdist OUT WHO: set SDIST to the sha256-checked sdist (LLAMA_CPP_PYTHON_SDIST, else
# OUT/sdist/, downloaded from PyPI when missing); WHO names the script in its messages.
fetch_sdist() {
    local out="$1" who="$2"
    SDIST="${LLAMA_CPP_PYTHON_SDIST:-${out}/sdist/${SDIST_NAME}}"
    if [[ ! -f "${SDIST}" ]]; then
        echo "${who}: downloading ${SDIST_NAME} from PyPI"
        mkdir -p "${out}/sdist"
        "${PYTHON:-python3}" -m pip download --no-binary :all: --no-deps \
            "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" -d "${out}/sdist"
    fi
    echo "${SDIST_SHA256}  ${SDIST}" | sha256sum -c --quiet - \
        || { echo "${who}: sha256 mismatch for ${SDIST}" >&2; return 1; }
}

# unpack_sdist SRC_ROOT WHO: set LLAMA_SRC to the vendored llama.cpp, unpacking the sdist (fetch_sdist
# first) into SRC_ROOT unless it is there already.
unpack_sdist() {
    local src_root="$1" who="$2"
    LLAMA_SRC="${src_root}/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
    if [[ ! -f "${LLAMA_SRC}/CMakeLists.txt" ]]; then
        echo "${who}: unpacking"
        mkdir -p "${src_root}"
        tar -xzf "${SDIST}" -C "${src_root}"
    fi
}
