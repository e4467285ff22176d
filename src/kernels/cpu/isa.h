// Instruction-set levels of the CPU kernels and what this CPU supports.
//
// Compiled once, for the baseline of the architecture, so the detection itself runs on any CPU.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace astrai::kernels {

// The levels, from the portable reference up (see level.h for what each means).
enum class Isa { kGeneric, kV3, kV4, kNeon };

std::string_view isa_name(Isa isa);  // "generic", "v3", "v4", "neon"
// Parses a level name; throws astrai::Error naming the accepted ones otherwise.
Isa parse_isa(std::string_view name);

struct CpuInfo {
  std::string model;                  // e.g. "AMD EPYC 7B13" (empty if unknown)
  std::string vendor;                 // x86-64 cpuid vendor: "GenuineIntel", "AuthenticAMD" (else empty)
  std::string arch;                   // "x86_64" or "aarch64"
  std::vector<std::string> features;  // detected features that matter to us, in a fixed order
  std::vector<Isa> supported;         // levels compiled into this binary that this CPU can run, lowest first
};

// Detected once (cpuid + xgetbv on x86-64, getauxval on AArch64), then cached.
const CpuInfo& cpu_info();

// Levels compiled into this binary, lowest first.
const std::vector<Isa>& compiled_isas();
bool isa_supported(Isa isa);  // compiled in and runnable on this CPU
bool cpu_has(std::string_view feature);  // `feature` (a name of CpuInfo::features) was detected
// The 8-bit dot-product extension ("VNNI" for short, on every CPU) a level's integer kernels may
// use where the CPU has it: "avx_vnni" for v3, "avx512_vnni" for v4, "asimddp" (ARMv8.2's sdot)
// for neon, null for generic.
const char* vnni_feature(Isa isa);
Isa best_isa();               // the highest supported level

}  // namespace astrai::kernels
