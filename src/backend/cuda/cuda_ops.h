// The CUDA backend (library astrai_backend_cuda, built when the CUDA toolkit is found at
// configure time: ASTRAI_CUDA; linking it registers it with backend::ops_for): backend::Ops
// over device memory, with cuBLAS for the matrix products and plain kernels for
// the rest. Status: compiled in CI, and checked op by op against the CPU backend by
// tests/backend/cuda_ops_test.cc, which only runs on a machine with an NVIDIA GPU
// (scripts/gpu-check.sh). See docs/architecture.md for what is not done yet.
#pragma once

#include <cstddef>
#include <string>

#include "backend/ops.h"

namespace astrai::backend::cuda {

// Whether a CUDA device can be used; if not, `why` says what is missing.
bool available(std::string* why = nullptr);

// The backend (throws astrai::Error when no device is available).
const Ops& ops();

// Device memory for buffers and weights, and copies between it and the host.
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Waits for every queued operation (and reports the first asynchronous error).
void synchronize();

}  // namespace astrai::backend::cuda
