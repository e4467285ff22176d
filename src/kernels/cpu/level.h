// One instruction-set level of the CPU kernels.
//
// Every kernel source (src/kernels/cpu/*.cc except isa.cc and dispatch.cc) is compiled once
// per level the target supports (src/CMakeLists.txt), with ASTRAI_ISA naming the level:
//   generic  portable C++, no intrinsics: the reference every other level must equal bit for bit
//   v3       x86-64-v3: AVX2 + FMA + F16C (16 ymm registers)
//   v4       x86-64-v4: AVX-512 F/BW/CD/DQ/VL (32 zmm registers)
//   neon     AArch64 Advanced SIMD
// The whole project is compiled for the baseline of its architecture (x86-64 or armv8-a). A
// level's code sits between ASTRAI_KERNELS_BEGIN and ASTRAI_KERNELS_END: in its own namespace
// (astrai::kernels::v4, ...), so no function, inline helper or template of ours compiled for one
// level can be linked into another, and under `#pragma GCC target`, so only those functions use
// the level's instructions. Standard-library templates instantiated from there keep the
// baseline target (GCC instantiates a template with the options of its definition), so a copy
// the linker picks for the rest of the program never holds AVX2 or AVX-512 code. Include every
// header (standard, intrinsics, project) before ASTRAI_KERNELS_BEGIN;
// scripts/check-isa.sh verifies the linked binaries.
#pragma once

#if !defined(ASTRAI_ISA)
#error "kernel sources are compiled once per level with ASTRAI_ISA defined (see src/CMakeLists.txt)"
#endif

#define ASTRAI_PRAGMA(x) _Pragma(#x)

#if defined(ASTRAI_ISA_V4)
#define ASTRAI_KERNELS_TARGET ASTRAI_PRAGMA(GCC push_options) ASTRAI_PRAGMA(GCC target("arch=x86-64-v4"))
#define ASTRAI_KERNELS_TARGET_END ASTRAI_PRAGMA(GCC pop_options)
#elif defined(ASTRAI_ISA_V3)
#define ASTRAI_KERNELS_TARGET ASTRAI_PRAGMA(GCC push_options) ASTRAI_PRAGMA(GCC target("arch=x86-64-v3"))
#define ASTRAI_KERNELS_TARGET_END ASTRAI_PRAGMA(GCC pop_options)
#elif defined(ASTRAI_ISA_NEON) || defined(ASTRAI_ISA_GENERIC)
// NEON is part of the AArch64 baseline; generic is the baseline.
#define ASTRAI_KERNELS_TARGET
#define ASTRAI_KERNELS_TARGET_END
#else
#error "unknown ASTRAI_ISA level"
#endif

// GCC 12's AVX-512 headers (_mm512_undefined_ps) trip the uninitialized warnings wherever
// their intrinsics are inlined.
#define ASTRAI_KERNELS_BEGIN                                  \
  ASTRAI_PRAGMA(GCC diagnostic push)                          \
  ASTRAI_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized") \
  ASTRAI_PRAGMA(GCC diagnostic ignored "-Wuninitialized")     \
  ASTRAI_KERNELS_TARGET namespace astrai::kernels::ASTRAI_ISA {
#define ASTRAI_KERNELS_END \
  }                        \
  ASTRAI_KERNELS_TARGET_END ASTRAI_PRAGMA(GCC diagnostic pop)
