#!/usr/bin/env bash
# The CUDA backend's proof on a machine with an NVIDIA GPU: every operation of backend::Ops on
# the GPU against the CPU backend, several shapes each, at the tolerances written in
# tests/backend/cuda_ops_test.cc; prints the GPU and the results.
#
#   scripts/gpu-check.sh                 build (release, CUDA on) and run here
#   scripts/gpu-check.sh --pack DIR      build here and copy the test binary and the shared
#                                        libraries it needs (not the CUDA driver's) into DIR,
#                                        for a GPU machine without the project's build deps
#   ASTRAI_GPU_PREBUILT=DIR scripts/gpu-check.sh
#                                        run the packed binary from DIR
#
# Not yet part of it (the model's buffers are still host memory, docs/architecture.md):
# generation and training on the GPU against the CPU, and decode tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
  cmake --preset release -DASTRAI_CUDA=ON >/dev/null
  cmake --build --preset release -j "$(nproc)" --target backend_tests
}

if [ "${1:-}" = --pack ]; then
  dir=${2:?usage: gpu-check.sh --pack DIR}
  build
  mkdir -p "$dir"
  cp build/release/tests/backend/backend_tests "$dir/"
  # Everything ldd resolves except the C library, the loader and CUDA's own libraries.
  ldd "$dir/backend_tests" | awk '/=> \// {print $3}' |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcuda\.so|libcublas' |
    while read -r lib; do cp -L "$lib" "$dir/"; done
  echo "packed into $dir: $(ls "$dir" | tr '\n' ' ')"
  exit 0
fi

if [ -n "${ASTRAI_GPU_PREBUILT:-}" ]; then
  bin=$ASTRAI_GPU_PREBUILT/backend_tests
  # cuBLAS from the CUDA toolkit, or from the nvidia-cublas Python package.
  cublas_dirs=$(find /usr/local/cuda*/lib64 /usr/local/lib/python3*/dist-packages/nvidia/cu*/lib \
    /usr/lib/python3*/site-packages/nvidia/cu*/lib -maxdepth 1 -name 'libcublas.so*' -printf '%h:' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$ASTRAI_GPU_PREBUILT:${cublas_dirs}${LD_LIBRARY_PATH:-}"
else
  build
  bin=build/release/tests/backend/backend_tests
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: not available"
# Fails if any op differs from the CPU backend beyond its tolerance, or if the GPU is not usable
# (the CUDA tests would only be skipped).
out=$("$bin" --gtest_filter='CudaOps.*:BackendOps.*' 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if grep -q SKIPPED <<<"$out"; then
  echo "gpu-check: the CUDA tests were skipped: no usable GPU" >&2
  exit 1
fi
echo "gpu-check: every CUDA op agrees with the CPU backend"
