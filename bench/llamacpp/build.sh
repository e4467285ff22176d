#!/usr/bin/env bash
# Builds llama.cpp (CPU only, Release) from the source that npm package node-llama-cpp ships as a
# git bundle (scripts/fetch-assets.sh puts it under assets/npm/), for the side-by-side benchmark in
# bench/llamacpp/compare.py. Idempotent.
#   bench/llamacpp/build.sh [DIR [LEVEL]]
#     DIR:   where to clone and build (default build/llamacpp)
#     LEVEL: native (default: tuned for this CPU, GGML_NATIVE), v3 (AVX2 + FMA + F16C + BMI2 only,
#            what an AVX2-only CPU such as AMD Zen 2/3 gets) or v3-vnni (v3 plus AVX-VNNI, as Intel
#            client CPUs since Alder Lake); v3 and v3-vnni build in DIR/build-LEVEL.
# Prints the directory of the binaries (llama-bench, llama-batched-bench, llama-quantize, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/build/llamacpp}
bundle=$root/assets/npm/node-llama-cpp/llama/gitRelease.bundle
[ -f "$bundle" ] || { echo "llamacpp/build: $bundle is missing: run scripts/fetch-assets.sh" >&2; exit 1; }
if [ ! -d "$dir/src/.git" ]; then
  mkdir -p "$dir"
  git clone -q "$bundle" "$dir/src" 2>/dev/null
fi
level=${2:-native}
case "$level" in
  native) out=$dir/build; isa=(-DGGML_NATIVE=ON) ;;
  v3|v3-vnni)
    out=$dir/build-$level
    vnni=OFF; [ "$level" = v3-vnni ] && vnni=ON
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
         -DGGML_AVX_VNNI=$vnni -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF) ;;
  *) echo "llamacpp/build: level '$level' is not one of native, v3, v3-vnni" >&2; exit 1 ;;
esac
jobs=$(nproc)
if [ ! -x "$out/bin/llama-batched-bench" ]; then
  echo "llamacpp/build: building llama.cpp $(git -C "$dir/src" log -1 --format=%h) ($level) in $out ($jobs jobs)" >&2
  cmake -S "$dir/src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$out" -j "$jobs" --target llama-bench llama-batched-bench llama-quantize llama-perplexity >&2
fi
echo "$out/bin"
