#include "kernels/cpu/isa.h"

#include <cstdint>
#include <cstring>
#include <fstream>

#include "base/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace astrai::kernels {

namespace {

#if defined(__x86_64__)
struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

bool bit(uint32_t reg, int n) { return (reg >> n) & 1u; }

// XCR0: which register states the OS saves on a context switch (valid only with OSXSAVE).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string brand() {
  if (cpuid(0x80000000).a < 0x80000004) return {};
  char text[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002 + i);
    std::memcpy(text + 16 * i, &r.a, 4);
    std::memcpy(text + 16 * i + 4, &r.b, 4);
    std::memcpy(text + 16 * i + 8, &r.c, 4);
    std::memcpy(text + 16 * i + 12, &r.d, 4);
  }
  std::string s(text);
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

CpuInfo detect() {
  CpuInfo info;
  info.arch = "x86_64";
  info.model = brand();
  const Regs l0 = cpuid(0);
  const uint32_t max_leaf = l0.a;
  char vendor[13] = {};  // "GenuineIntel", "AuthenticAMD", ...: ebx, edx, ecx
  std::memcpy(vendor, &l0.b, 4);
  std::memcpy(vendor + 4, &l0.d, 4);
  std::memcpy(vendor + 8, &l0.c, 4);
  info.vendor = vendor;
  const Regs l1 = cpuid(1);
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = max_leaf >= 7 && l7.a >= 1 ? cpuid(7, 1) : Regs{};
  const Regs e1 = cpuid(0x80000000).a >= 0x80000001 ? cpuid(0x80000001) : Regs{};
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6) == 0x6;        // XMM and YMM state
  const bool os_avx512 = (xcr & 0xe6) == 0xe6;   // plus opmask, ZMM_Hi256, Hi16_ZMM

  struct Feature {
    const char* name;
    bool present;
  };
  const Feature features[] = {
      {"sse4.2", bit(l1.c, 20)},         {"popcnt", bit(l1.c, 23)},       {"avx", bit(l1.c, 28)},
      {"avx2", bit(l7.b, 5)},            {"fma", bit(l1.c, 12)},          {"f16c", bit(l1.c, 29)},
      {"bmi1", bit(l7.b, 3)},            {"bmi2", bit(l7.b, 8)},          {"lzcnt", bit(e1.c, 5)},
      {"movbe", bit(l1.c, 22)},          {"avx512f", bit(l7.b, 16)},      {"avx512dq", bit(l7.b, 17)},
      {"avx512cd", bit(l7.b, 28)},       {"avx512bw", bit(l7.b, 30)},     {"avx512vl", bit(l7.b, 31)},
      {"avx512_vnni", bit(l7.c, 11)},    {"avx512_bf16", bit(l7s1.a, 5)}, {"avx512_fp16", bit(l7.d, 23)},
      {"avx_vnni", bit(l7s1.a, 4)},      {"amx_tile", bit(l7.d, 24)},     {"os_avx", os_avx},
      {"os_avx512", os_avx512},
  };
  for (const Feature& f : features)
    if (f.present) info.features.emplace_back(f.name);

  // x86-64-v2 (implied by every v3 CPU, but GCC may use it in v3 code) and v3.
  const bool v2 = bit(l1.c, 0) && bit(l1.c, 9) && bit(l1.c, 13) && bit(l1.c, 19) && bit(l1.c, 20) &&
                  bit(l1.c, 23) && bit(e1.c, 0);
  const bool v3 = v2 && os_avx && bit(l1.c, 28) && bit(l7.b, 5) && bit(l1.c, 12) && bit(l1.c, 29) &&
                  bit(l7.b, 3) && bit(l7.b, 8) && bit(e1.c, 5) && bit(l1.c, 22);
  const bool v4 = v3 && os_avx512 && bit(l7.b, 16) && bit(l7.b, 17) && bit(l7.b, 28) && bit(l7.b, 30) &&
                  bit(l7.b, 31);
  info.supported.push_back(Isa::kGeneric);
  if (v3) info.supported.push_back(Isa::kV3);
  if (v4) info.supported.push_back(Isa::kV4);
  return info;
}

#elif defined(__aarch64__)

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return {};
}

CpuInfo detect() {
  CpuInfo info;
  info.arch = "aarch64";
  info.model = cpuinfo_field("model name");
  if (info.model.empty()) info.model = cpuinfo_field("CPU part");
  const unsigned long hw = getauxval(AT_HWCAP);
  const unsigned long hw2 = getauxval(AT_HWCAP2);
  struct Feature {
    const char* name;
    bool present;
  };
  const Feature features[] = {
      {"asimd", (hw & HWCAP_ASIMD) != 0},     {"fphp", (hw & HWCAP_FPHP) != 0},
      {"asimdhp", (hw & HWCAP_ASIMDHP) != 0}, {"asimddp", (hw & HWCAP_ASIMDDP) != 0},
      {"sve", (hw & HWCAP_SVE) != 0},         {"i8mm", (hw2 & HWCAP2_I8MM) != 0},
      {"bf16", (hw2 & HWCAP2_BF16) != 0},
  };
  for (const Feature& f : features)
    if (f.present) info.features.emplace_back(f.name);
  info.supported.push_back(Isa::kGeneric);
  if (hw & HWCAP_ASIMD) info.supported.push_back(Isa::kNeon);
  return info;
}

#else

CpuInfo detect() {
  CpuInfo info;
  info.supported.push_back(Isa::kGeneric);
  return info;
}

#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kV3: return "v3";
    case Isa::kV4: return "v4";
    case Isa::kNeon: return "neon";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kGeneric, Isa::kV3, Isa::kV4, Isa::kNeon})
    if (name == isa_name(isa)) return isa;
  fail("unknown CPU level \"", name, "\" (expected auto, generic, v3, v4 or neon)");
}

const std::vector<Isa>& compiled_isas() {
#if defined(__x86_64__)
  static const std::vector<Isa> isas = {Isa::kGeneric, Isa::kV3, Isa::kV4};
#elif defined(__aarch64__)
  static const std::vector<Isa> isas = {Isa::kGeneric, Isa::kNeon};
#else
  static const std::vector<Isa> isas = {Isa::kGeneric};
#endif
  return isas;
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

bool isa_supported(Isa isa) {
  for (Isa s : cpu_info().supported)
    if (s == isa) return true;
  return false;
}

bool cpu_has(std::string_view feature) {
  for (const std::string& f : cpu_info().features)
    if (f == feature) return true;
  return false;
}

const char* vnni_feature(Isa isa) {
  switch (isa) {
    case Isa::kV4: return "avx512_vnni";
    case Isa::kV3: return "avx_vnni";
    case Isa::kNeon: return "asimddp";
    default: return nullptr;
  }
}

Isa best_isa() { return cpu_info().supported.back(); }

}  // namespace astrai::kernels
