#!/usr/bin/env bash
# Cross-compiles the CPU kernels (levels generic and neon) for AArch64 and runs their tests, and
# those of the base and tensor layers, under qemu-user: the byte-for-byte comparison of neon with
# generic, and the reference tests on each. Needs Debian's multiarch arm64 packages (installed
# here; the arm64 runtime libraries must match the installed amd64 versions, as they do on a
# Debian 12 machine that is up to date with its archive).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${ASTRAI_JOBS:-$(nproc)}

pkgs=(g++-aarch64-linux-gnu qemu-user libgtest-dev:arm64 libgmock-dev:arm64 libopenblas-openmp-dev:arm64
      libstdc++6:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  dpkg --add-architecture arm64
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# No binfmt_misc here: ctest runs the test binaries through CMAKE_CROSSCOMPILING_EMULATOR.
cmake -S . -B build/aarch64 -G Ninja --toolchain "$PWD/cmake/aarch64-toolchain.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DASTRAI_KERNELS_ONLY=ON
cmake --build build/aarch64 -j "$jobs"
ctest --test-dir build/aarch64 -j "$jobs" --output-on-failure
