// Process-wide choice between the batch-invariant linear kernel and the BLAS.
//
// On (the default): kernels::linear reduces every output over K in one fixed order for every M
// (see matmul.cc), so a row's result never depends on the batch it was computed in. The
// inference engine relies on this (greedy output identical alone, batched or chunked).
// Off: rows beyond a few per call go through cblas_sgemm, whose blocking and kernels change
// with the shape; results may differ in the last bits between batch shapes. Small M (decode)
// always uses our own kernel, which streams the weights faster than the BLAS GEMV.
#pragma once

namespace astrai::kernels {

void set_batch_invariant(bool on);
bool batch_invariant();

}  // namespace astrai::kernels
