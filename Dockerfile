# AstrAI serving image: `astrai serve` on Debian 12, CPU (docs/server.md, "Containers and load balancing").
#
#   podman build --format docker -t astrai .      (or: docker build -t astrai .)
#   podman run -p 8000:8000 -v /path/to/model:/models/model:ro astrai
#
# The binary is the default portable build (x86-64-v3 baseline, AVX-512 kernels chosen at run
# time), so the image runs on any x86-64-v3 CPU, not only the build machine's. The CUDA variant is
# Dockerfile.cuda. The base images are build arguments so that a site without a registry can
# point them at a local Debian 12 image (scripts/test-image.sh makes one with debootstrap).
ARG BUILD_IMAGE=docker.io/library/debian:bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
# The same package list CI installs (scripts/install-deps.sh), limited to what the binary needs;
# ccache (and the cache mount below) makes a rebuild of the image recompile only what changed.
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN bash /src/scripts/install-deps.sh --build-only \
 && apt-get install -y -qq --no-install-recommends ccache \
 && rm -rf /var/lib/apt/lists/*
COPY CMakeLists.txt CMakePresets.json /src/
COPY cmake /src/cmake
COPY src /src/src
WORKDIR /src
# The release preset CI builds, without tests and benchmarks; ASTRAI_CUDA=OFF: this is the CPU image.
ARG BUILD_JOBS=
RUN --mount=type=cache,target=/root/.ccache \
    cmake --preset release -DASTRAI_BUILD_TESTS=OFF -DASTRAI_BUILD_BENCH=OFF -DASTRAI_CUDA=OFF -DASTRAI_MPI=OFF \
          -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
 && cmake --build --preset release --target astrai ${BUILD_JOBS:+-j ${BUILD_JOBS}} \
 && strip build/release/src/astrai \
 && build/release/src/astrai --help >/dev/null

FROM ${RUNTIME_IMAGE}
# Only the shared libraries `ldd astrai` lists (OpenBLAS on OpenMP, HDF5, PCRE2, ICU, librsvg for
# `astrai plot`), and curl
# for the health check (libcurl comes with HDF5 anyway).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libopenblas0-openmp libgomp1 libhdf5-103-1 libpcre2-8-0 libicu72 librsvg2-2 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin astrai \
 && mkdir -p /models
COPY --from=build /src/build/release/src/astrai /usr/local/bin/astrai
# The model directory (config.json, safetensors, tokenizer) is mounted here, read-only is enough.
VOLUME /models
USER astrai
EXPOSE 8000
# /health: 200 once the model is loaded and until SIGTERM; 503 while loading or draining. (A full
# queue makes only /health/ready 503: the load balancer's concern, not a reason to restart.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8000/health || exit 1
# SIGTERM (docker/podman stop) drains: running requests get --grace seconds (30 by default) to
# finish; give `stop` a timeout above that (compose: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["astrai", "serve"]
# Inside a container the server must listen on every address; when replacing CMD, keep --host 0.0.0.0.
CMD ["--model", "/models/model", "--host", "0.0.0.0", "--port", "8000"]
