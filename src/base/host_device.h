// ASTRAI_HOST_DEVICE marks a function that both the host compiler and nvcc compile, so the CPU
// backend and the CUDA kernels run one definition (backend/dropout_mask.h, backend/sample_rows.h).
#pragma once

#if defined(__CUDACC__)
#define ASTRAI_HOST_DEVICE __host__ __device__
#else
#define ASTRAI_HOST_DEVICE
#endif
