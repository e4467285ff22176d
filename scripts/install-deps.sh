#!/usr/bin/env bash
# Installs every Debian package AstrAI builds, tests and benchmarks with. Idempotent.
# --build-only: only what `cmake --preset release -DASTRAI_BUILD_TESTS=OFF -DASTRAI_BUILD_BENCH=OFF`
# needs to build the `astrai` binary (the container image's build stage, see Dockerfile).
set -euo pipefail
BUILD_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --build-only) BUILD_ONLY=1 ;;
    *) echo "install-deps: unknown argument: $arg (known: --build-only)" >&2; exit 2 ;;
  esac
done
BUILD_PKGS=(
  build-essential cmake ninja-build pkg-config ca-certificates
  libopenblas-openmp-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libhdf5-dev libboost-dev libicu-dev
  librsvg2-dev
)
PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenblas-openmp-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libpcre2-dev libhdf5-dev libboost-dev libicu-dev
  librsvg2-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-numpy python3-jinja2 python3-h5py python3-sentencepiece python3-tqdm
  curl chromium
  qemu-user
)
if [ "$BUILD_ONLY" = 1 ]; then PKGS=("${BUILD_PKGS[@]}"); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js (with npm) runs the JS oracles; some images ship it from elsewhere, so check the command.
[ "$BUILD_ONLY" = 1 ] || command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#PKGS[@]} packages present"
