#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test:
# unit + oracle tests on the release build, then the unit tests under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${ASTRAI_JOBS:-$(nproc)}
scripts/install-deps.sh
scripts/fetch-assets.sh

cmake --preset release
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if [ "${ASTRAI_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan
  cmake --build --preset asan -j "$jobs"
  ctest --preset asan -j "$jobs"
fi
