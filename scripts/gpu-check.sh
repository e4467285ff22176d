#!/usr/bin/env bash
# The CUDA backend's proof on a machine with an NVIDIA GPU: every operation of backend::Ops on
# the GPU against the CPU backend, several shapes each (tests/backend/cuda_ops_test.cc), and the
# whole forward of three model families on the GPU against the CPU, without a cache and through
# device pages with greedy decode steps (tests/model/cuda_forward_test.cc), at the tolerances
# written there; prints the GPU and the results.
#
#   scripts/gpu-check.sh                 build (release, CUDA on) and run here
#   scripts/gpu-check.sh --pack DIR      build here and copy the test binary and the shared
#                                        libraries it needs (not the CUDA driver's) into DIR,
#                                        for a GPU machine without the project's build deps
#   ASTRAI_GPU_PREBUILT=DIR scripts/gpu-check.sh
#                                        run the packed binary from DIR
#
# Then the decode benchmark (bench/cuda/decode_bench.cc): tokens/s at batch 1, 8 and 32 and the
# share of the device's copy rate batch-1 decode reads weights at.
# Not yet part of it (docs/architecture.md): the commands on the GPU (--device), training on the
# GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
  cmake --preset release -DASTRAI_CUDA=ON >/dev/null
  cmake --build --preset release -j "$(nproc)" --target backend_tests model_tests cuda_decode_bench
}

if [ "${1:-}" = --pack ]; then
  dir=${2:?usage: gpu-check.sh --pack DIR}
  build
  mkdir -p "$dir"
  cp build/release/tests/backend/backend_tests build/release/tests/model/model_tests \
    build/release/bench/cuda_decode_bench "$dir/"
  # Everything ldd resolves except the C library, the loader and CUDA's own libraries.
  ldd "$dir/backend_tests" "$dir/model_tests" | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|libcuda\.so|libcublas' |
    while read -r lib; do cp -L "$lib" "$dir/"; done
  echo "packed into $dir: $(ls "$dir" | tr '\n' ' ')"
  exit 0
fi

if [ -n "${ASTRAI_GPU_PREBUILT:-}" ]; then
  bin_dir=$ASTRAI_GPU_PREBUILT
  # cuBLAS from the CUDA toolkit, or from the nvidia-cublas Python package.
  cublas_dirs=$(find /usr/local/cuda*/lib64 /usr/local/lib/python3*/dist-packages/nvidia/cu*/lib \
    /usr/lib/python3*/site-packages/nvidia/cu*/lib -maxdepth 1 -name 'libcublas.so*' -printf '%h:' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$ASTRAI_GPU_PREBUILT:${cublas_dirs}${LD_LIBRARY_PATH:-}"
else
  build
  bin_dir=build/release/tests
fi
find_bin() {
  for p in "$bin_dir/$1" "$bin_dir/${1%_tests}/$1" "$bin_dir/../bench/$1"; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
  echo "$bin_dir/$1"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: not available"
# Fails if any op or forward differs from the CPU beyond its tolerance, or if the GPU is not
# usable (the CUDA tests would only be skipped).
status=0
run_tests() {  # BINARY FILTER
  local out
  out=$("$(find_bin "$1")" --gtest_filter="$2" 2>&1) || status=1
  echo "$out"
  if grep -q SKIPPED <<<"$out"; then
    echo "gpu-check: the CUDA tests were skipped: no usable GPU" >&2
    exit 1
  fi
}
run_tests backend_tests 'CudaOps.*:BackendOps.*'
run_tests model_tests '*CudaForward.*'
[ $status = 0 ] && echo "gpu-check: every CUDA op and forward agrees with the CPU backend"
"$(find_bin cuda_decode_bench)" || status=1
exit $status
