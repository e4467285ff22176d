// The CUDA backend (library astrai_backend_cuda, built when the CUDA toolkit is found at
// configure time: ASTRAI_CUDA; linking it registers it with backend::ops_for): backend::Ops
// over device memory, with cuBLAS for the matrix products and plain kernels for
// the rest, on one stream; decode steps replay as CUDA graphs (Ops::run_cached). Compiled in
// CI; checked op by op and whole forwards against the CPU backend by tests/backend/
// cuda_ops_test.cc and tests/model/cuda_forward_test.cc, which run on a machine with an NVIDIA
// GPU (scripts/gpu-check.sh; first passed on an H200, 2026-12-04). See docs/architecture.md for
// what is not done yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/ops.h"

namespace astrai::backend::cuda {

// Whether a CUDA device can be used; if not, `why` says what is missing.
bool available(std::string* why = nullptr);

// The backend (throws astrai::Error when no device is available).
const Ops& ops();

// Decode steps replayed as CUDA graphs (Ops::run_cached): on unless ASTRAI_CUDA_GRAPHS=0 or
// turned off here (the tests and the benchmark compare both ways). graph_replays counts the
// steps that ran as a replay.
void set_graphs(bool on);
int64_t graph_replays();

// The cached steps (Ops::run_cached) run op by op or replayed since the last call: how many,
// the host's time issuing them (op by op: every launch; replayed: preparing the uploads and
// launching the graph) and the device's time from their first operation to their last
// (CUDA events). The first step of a key and its capture are not counted.
struct StepTiming {
  int64_t steps = 0;
  double host_seconds = 0, device_seconds = 0;
};
StepTiming take_step_timing();

// Device memory for buffers and weights, and copies between it and the host.
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Waits for every queued operation (and reports the first asynchronous error).
void synchronize();

}  // namespace astrai::backend::cuda
