// The kernels OpenBLAS uses on this CPU.
//
// Debian's OpenBLAS (DYNAMIC_ARCH) picks its kernels once, when the library loads, from the CPU
// model number. A build older than the CPU does not know the model and falls back to its oldest
// x86-64 kernels: Debian 12's 0.3.21 runs "Prescott" (SSE3) kernels on a 5th-generation Xeon,
// a tenth of the GEMM rate the CPU has. The only way to choose is the OPENBLAS_CORETYPE
// environment variable, read at load, so a program that finds such a fallback sets it and
// executes itself again, before anything else runs.
#pragma once

#include <string>

namespace astrai::kernels {

// OpenBLAS's kernel family in this process ("Haswell", "SkylakeX", "Prescott", ...).
std::string blas_core();

// The family this CPU's instruction sets call for when OpenBLAS fell back to kernels without
// AVX2, else "" (OpenBLAS's choice stands; so does any OPENBLAS_CORETYPE the user set):
// "Cooperlake" (AVX-512 + avx512_bf16), "SkylakeX" (AVX-512) or "Haswell" (AVX2 + FMA).
std::string blas_core_upgrade();

// Call first in main(): when blas_core_upgrade() names a family, sets OPENBLAS_CORETYPE to it,
// logs why, and executes /proc/self/exe again with the same arguments. Returns (changing
// nothing) when no upgrade is due or the re-execution fails.
void reexec_for_blas_core(char** argv);

}  // namespace astrai::kernels
