#!/usr/bin/env bash
# Sets everything up on a fresh Debian 12 machine and runs every test:
# unit + oracle tests on the release build (every CPU level this machine runs, compared with the
# portable one), the unit tests under ASan+UBSan, the inference engine's concurrency tests under
# ThreadSanitizer, then (on x86-64) the AArch64 kernels cross-built and tested under qemu-user.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${ASTRAI_JOBS:-$(nproc)}
# CI must finish within 60 minutes: each phase says how long it took.
phase_start=$SECONDS
phase_done() { echo "test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"; phase_start=$SECONDS; }
scripts/install-deps.sh
scripts/fetch-assets.sh
phase_done "setup (packages, assets)"

cmake --preset release
cmake --build --preset release -j "$jobs"
phase_done "release build"
ctest --preset release -j "$jobs"
phase_done "release tests"

# The sanitizer presets (asan, tsan) compile at -O1 -g1: reports keep file:line (line tables),
# and the build takes half the time of -O2 -g (13.8 min here for every unit-test binary).
if [ "${ASTRAI_SKIP_ASAN:-0}" != 1 ]; then
  cmake --preset asan
  cmake --build --preset asan -j "$jobs" --target astrai_unit_tests  # the unit tests' binaries only
  phase_done "asan build"
  ctest --preset asan -j "$jobs"
  phase_done "asan tests"
fi

# ThreadSanitizer: the engine tests (concurrent submitters, cancellation from other threads and
# callbacks, shutdown). One OpenMP thread: Debian's libgomp is not TSan-instrumented, so TSan
# cannot see the barrier ending a parallel region (docs/inference.md). Any report fails the run.
if [ "${ASTRAI_SKIP_TSAN:-0}" != 1 ]; then
  cmake --preset tsan
  cmake --build --preset tsan -j "$jobs" --target infer_tests
  OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66" build/tsan/tests/infer/infer_tests
  phase_done "tsan build and tests"
fi

# The serving image (Dockerfile, docker-compose.yml) built and run with podman: opt-in, a cold
# image build took 27 minutes here (docs/server.md, "Containers and load balancing").
if [ "${ASTRAI_TEST_IMAGE:-0}" = 1 ]; then
  scripts/test-image.sh
else
  echo "test.sh: the image test (scripts/test-image.sh) is skipped; ASTRAI_TEST_IMAGE=1 runs it"
fi

# AArch64: the neon and generic kernels, cross-compiled, under emulation.
if [ "${ASTRAI_SKIP_AARCH64:-0}" != 1 ] && [ "$(uname -m)" = x86_64 ]; then
  scripts/test-aarch64.sh
  phase_done "aarch64 build and tests"
fi
