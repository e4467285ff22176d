#!/usr/bin/env bash
# Builds llama.cpp (CPU only, Release, tuned for this CPU) from the source that npm package
# node-llama-cpp ships as a git bundle (scripts/fetch-assets.sh puts it under assets/npm/),
# for the side-by-side benchmark in bench/llamacpp/compare.py. Idempotent.
#   bench/llamacpp/build.sh [DIR]     DIR: where to clone and build (default build/llamacpp)
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
jobs=$(nproc)
if [ ! -x "$dir/build/bin/llama-batched-bench" ]; then
  echo "llamacpp/build: building llama.cpp $(git -C "$dir/src" log -1 --format=%h) in $dir/build ($jobs jobs)" >&2
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$dir/build" -j "$jobs" --target llama-bench llama-batched-bench llama-quantize llama-perplexity >&2
fi
echo "$dir/build/bin"
