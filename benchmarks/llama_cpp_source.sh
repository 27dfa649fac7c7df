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

# Native builds and the sdist live outside the checkout, so that a fresh clone on the same machine
# (CI's) builds nothing again: $LOCALINFER_CI_CACHE, default ~/.cache/localinfer-ci.
CI_CACHE="${LOCALINFER_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localinfer-ci}"

# fetch_sdist WHO: set SDIST to the sha256-checked sdist (LLAMA_CPP_PYTHON_SDIST, else
# $CI_CACHE/sdist/, downloaded from PyPI when missing); WHO names the script in its messages.
fetch_sdist() {
    local who="$1"
    SDIST="${LLAMA_CPP_PYTHON_SDIST:-${CI_CACHE}/sdist/${SDIST_NAME}}"
    if [[ ! -f "${SDIST}" ]]; then
        echo "${who}: downloading ${SDIST_NAME} from PyPI"
        mkdir -p "${CI_CACHE}/sdist"
        "${PYTHON:-python3}" -m pip download -q --no-binary :all: --no-deps \
            "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" -d "${CI_CACHE}/sdist"
    fi
    echo "${SDIST_SHA256}  ${SDIST}" | sha256sum -c --quiet - \
        || { echo "${who}: sha256 mismatch for ${SDIST}" >&2; return 1; }
}

# unpack_sdist WHO: set LLAMA_SRC to the vendored llama.cpp, unpacking the sdist (fetch_sdist first)
# into $CI_CACHE/src/ unless it is there already (unpacked aside, then renamed: never half there).
unpack_sdist() {
    local who="$1" root="${CI_CACHE}/src/${SDIST_SHA256:0:16}"
    LLAMA_SRC="${root}/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
    if [[ ! -f "${LLAMA_SRC}/CMakeLists.txt" ]]; then
        echo "${who}: unpacking"
        mkdir -p "${root}.tmp.$$"
        tar -xzf "${SDIST}" -C "${root}.tmp.$$"
        mv -T "${root}.tmp.$$" "${root}" 2>/dev/null || rm -rf "${root}.tmp.$$"  # another won the race
    fi
}

# build_key ARGS...: 16 hex digits naming one build by all that decides its binaries: the sdist, the
# CMake options ARGS, the compilers and cmake, flags from the environment, and the CPU's flags
# (GGML_NATIVE=ON compiles for this CPU: -march=native); and the generator (a tree keeps its own).
build_key() {
    {
        echo "sdist ${SDIST_SHA256}"
        printf 'arg %s\n' "$@"
        echo "cc $(${CC:-cc} --version 2>&1 | head -n 1); cxx $(${CXX:-c++} --version 2>&1 | head -n 1)"
        echo "$(cmake --version | head -n 1); CFLAGS=${CFLAGS:-} CXXFLAGS=${CXXFLAGS:-} LDFLAGS=${LDFLAGS:-}"
        echo "$(uname -m) $(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || true)"
    } | sha256sum | cut -c1-16
}

# cached_build WHO KIND: build TARGETS (an array) with the options CMAKE_OPTS (an array) in the CMake
# tree BUILD_DIR=$CI_CACHE/KIND/<build_key>, where it stays: a target built there once is not built
# again (FORCE=1 configures and builds anew). Sets BUILT=1 when it built something. One build per
# tree at a time (flock): two clones that build at once wait for each other.
cached_build() {
    local who="$1" kind="$2" t todo=() gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    BUILD_DIR="${CI_CACHE}/${kind}/$(build_key "${gen[@]}" "${CMAKE_OPTS[@]}")"
    BUILT=0
    mkdir -p "${BUILD_DIR}"
    exec 9>"${BUILD_DIR}.lock"
    flock 9
    for t in "${TARGETS[@]}"; do
        # the stamp is written after the build succeeded: a binary that an interrupted link left is not one
        if [[ "${FORCE:-0}" == "1" || ! -f "${BUILD_DIR}/.built-${t}" || ! -x "${BUILD_DIR}/bin/${t}" ]]; then
            todo+=("${t}")
        fi
    done
    if ((${#todo[@]} == 0)); then
        echo "${who}: ${TARGETS[*]} already built in ${BUILD_DIR} (FORCE=1 to rebuild)"
        exec 9>&-
        return 0
    fi
    command -v cmake >/dev/null || { echo "${who}: cmake not found" >&2; return 1; }
    fetch_sdist "${who}"
    unpack_sdist "${who}"
    # ggml turns GGML_NATIVE's *default* off when SOURCE_DATE_EPOCH is set; we set it explicitly
    # anyway, but keep the environment identical to a plain pip build.
    unset SOURCE_DATE_EPOCH
    echo "${who}: configuring ${BUILD_DIR}"
    cmake -S "${LLAMA_SRC}" -B "${BUILD_DIR}" "${gen[@]}" "${CMAKE_OPTS[@]}" >/dev/null
    echo "${who}: building ${todo[*]} with -j${JOBS:-2}"
    for t in "${todo[@]}"; do rm -f "${BUILD_DIR}/.built-${t}"; done
    cmake --build "${BUILD_DIR}" --config Release -j "${JOBS:-2}" --target "${todo[@]}"
    for t in "${todo[@]}"; do
        [[ -x "${BUILD_DIR}/bin/${t}" ]] || { echo "${who}: build finished but ${t} is missing" >&2; return 1; }
        touch "${BUILD_DIR}/.built-${t}"
    done
    BUILT=1
    exec 9>&-
}
