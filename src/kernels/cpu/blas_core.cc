#include "kernels/cpu/blas_core.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"
#include "kernels/cpu/isa.h"

extern "C" char* openblas_get_corename(void);

namespace astrai::kernels {

namespace {

bool has_feature(const char* name) {
  const auto& f = cpu_info().features;
  return std::find(f.begin(), f.end(), name) != f.end();
}

// OpenBLAS x86-64 families with AVX2 + FMA kernels or better (0.3.21's names).
bool avx2_family(const std::string& core) {
  static const char* const kFamilies[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  return std::any_of(std::begin(kFamilies), std::end(kFamilies), [&](const char* f) { return core == f; });
}

}  // namespace

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "";
}

std::string blas_core_upgrade() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  if (avx2_family(blas_core())) return "";
  if (isa_supported(Isa::kV4)) return has_feature("avx512_bf16") ? "Cooperlake" : "SkylakeX";
  if (isa_supported(Isa::kV3)) return "Haswell";
#endif
  return "";
}

void reexec_for_blas_core(char** argv) {
  const std::string core = blas_core_upgrade();
  if (core.empty()) return;
  log_info("cpu: OpenBLAS chose its ", blas_core(), " kernels for this CPU (",
           cpu_info().model.empty() ? "unknown model" : cpu_info().model, "); restarting with OPENBLAS_CORETYPE=", core);
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  log_warn("cpu: could not restart with OPENBLAS_CORETYPE=", core, " (", std::strerror(errno),
           "); OpenBLAS keeps its ", blas_core(), " kernels");
  ::unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace astrai::kernels
