// The active level's table and the public kernel entry points that forward to it. Compiled
// once, for the baseline.
#include "kernels/cpu/dispatch.h"

#include "kernels/cpu/gemm_mode.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "base/error.h"
#include "base/log.h"

namespace astrai::kernels {

// Each level's table (src/kernels/cpu/table.cc compiled per level).
namespace generic {
const KernelTable& table();
}
#if defined(__x86_64__)
namespace v3 {
const KernelTable& table();
}
namespace v4 {
const KernelTable& table();
}
#elif defined(__aarch64__)
namespace neon {
const KernelTable& table();
}
#endif

namespace {

const KernelTable* compiled_table(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return &generic::table();
#if defined(__x86_64__)
    case Isa::kV3: return &v3::table();
    case Isa::kV4: return &v4::table();
#elif defined(__aarch64__)
    case Isa::kNeon: return &neon::table();
#endif
    default: return nullptr;
  }
}

std::string supported_list() {
  std::string s;
  for (Isa isa : cpu_info().supported) s += (s.empty() ? "" : ", ") + std::string(isa_name(isa));
  return s;
}

// The table for `name` (auto or a level), where `source` says who asked. A level's table is
// touched only after the CPU is known to run it: its code may use the level's instructions.
const KernelTable& resolve(std::string_view name, std::string_view source) {
  Isa isa = Isa::kGeneric;
  try {
    isa = name == "auto" ? best_isa() : parse_isa(name);
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
  bool compiled = false;
  for (Isa c : compiled_isas()) compiled = compiled || c == isa;
  if (!compiled)
    fail(source, ": CPU level ", isa_name(isa), " is not built for ", cpu_info().arch, " (levels here: ", supported_list(),
         ")");
  if (!isa_supported(isa))
    fail(source, ": this CPU cannot run level ", isa_name(isa), " (",
         cpu_info().model.empty() ? "unknown CPU" : cpu_info().model, "; levels it runs: ", supported_list(), ")");
  return *compiled_table(isa);
}

void log_choice(const KernelTable& t, std::string_view how) {
  log_info("cpu: kernels ", isa_name(t.isa), " (", how, "; ", cpu_info().model.empty() ? cpu_info().arch : cpu_info().model,
           ")", !bf16_dot() ? "" : t.bf16_dot_native() ? "; bf16 dot products (VDPBF16PS)" : "; bf16 dot products (emulated)");
}

std::mutex g_mutex;
std::atomic<const KernelTable*> g_active{nullptr};

const KernelTable& active() {
  const KernelTable* t = g_active.load(std::memory_order_acquire);
  if (t != nullptr) return *t;
  std::lock_guard lock(g_mutex);
  t = g_active.load(std::memory_order_relaxed);
  if (t != nullptr) return *t;
  const char* env = std::getenv("ASTRAI_CPU_ISA");
  const std::string name = env != nullptr && *env != '\0' ? env : "auto";
  t = &resolve(name, "ASTRAI_CPU_ISA");
  log_choice(*t, name == "auto" ? "best this CPU runs" : "ASTRAI_CPU_ISA=" + name);
  g_active.store(t, std::memory_order_release);
  return *t;
}

}  // namespace

const KernelTable& kernel_table(Isa isa) { return resolve(isa_name(isa), "kernel_table"); }

Isa active_isa() { return active().isa; }

void select_isa(std::string_view name) {
  const KernelTable& t = resolve(name, "--cpu-isa");
  std::lock_guard lock(g_mutex);
  g_active.store(&t, std::memory_order_release);
  log_choice(t, name == "auto" ? "best this CPU runs" : "--cpu-isa " + std::string(name));
}

namespace {
std::atomic<bool> g_batch_invariant{true};
// By architecture, never by level (every level of one machine must give the same results):
// x86-64 q8, faster on every shape measured (docs/performance.md, "Against llama.cpp"); AArch64
// f32: neon's integer path (one output at a time, no tiles) has never been timed on ARM
// hardware against its f32 tiles.
#if defined(__x86_64__)
constexpr Activations kDefaultActivations = Activations::kQ8;
#else
constexpr Activations kDefaultActivations = Activations::kF32;
#endif
}  // namespace

void set_batch_invariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

Activations parse_activations(const char* name) {
  const std::string s = name;
  if (s == "f32") return Activations::kF32;
  if (s == "q8") return Activations::kQ8;
  fail("activations: '", s, "' is not one of f32, q8");
}
const char* activations_name(Activations a) { return a == Activations::kQ8 ? "q8" : "f32"; }

namespace {
// slot's value, settled by read() on first use (-1: not yet); of two racing first uses, the
// value stored first wins.
template <typename Read>
int settled(std::atomic<int>& slot, Read read) {
  int v = slot.load(std::memory_order_relaxed);
  if (v < 0) {
    v = read();
    int expected = -1;
    if (!slot.compare_exchange_strong(expected, v)) v = expected;
  }
  return v;
}

Activations initial_activations() {
  const char* env = std::getenv("ASTRAI_ACTIVATIONS");
  if (!env || !*env) return kDefaultActivations;
  try {
    return parse_activations(env);
  } catch (const Error& e) {
    fail("ASTRAI_ACTIVATIONS: ", e.what());
  }
}
std::atomic<int> g_activations{-1};
}  // namespace

void set_activations(Activations a) { g_activations.store(static_cast<int>(a), std::memory_order_relaxed); }
Activations activations() {
  return static_cast<Activations>(settled(g_activations, [] { return static_cast<int>(initial_activations()); }));
}

namespace {
std::atomic<int> g_vnni{-1};
std::atomic<int> g_bf16_dot{-1};

// A 0|1 switch from the environment: `unset` when unset or empty.
int env_switch(const char* name, int unset) {
  const char* env = std::getenv(name);
  const std::string s = env ? env : "";
  if (!s.empty() && s != "0" && s != "1") fail(name, ": '", s, "' is not 0 or 1");
  return s.empty() ? unset : s == "1" ? 1 : 0;
}
}  // namespace

void set_bf16_dot(bool on) { g_bf16_dot.store(on ? 1 : 0, std::memory_order_relaxed); }
bool bf16_dot() {
  return settled(g_bf16_dot, [] { return env_switch("ASTRAI_BF16_DOT", 0); }) == 1;
}

void set_vnni(bool on) { g_vnni.store(on ? 1 : 0, std::memory_order_relaxed); }
bool vnni_allowed() {
  return settled(g_vnni, [] { return env_switch("ASTRAI_CPU_VNNI", 1); }) == 1;
}
const char* vnni_in_use() {
  const char* feature = vnni_feature(active_isa());
  return vnni_allowed() && feature && cpu_has(feature) ? feature : "";
}

// The public entry points.

void linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y) {
  active().linear(x, m, w, bias, y);
}
void linear_group(const float* x, int64_t m, const LinearOut* outs, int64_t n) {
  active().linear_group(x, m, outs, n);
}
bool bf16_dot_native() { return active().bf16_dot_native(); }
const char* bf16_dot_name() { return !bf16_dot() ? "off" : bf16_dot_native() ? "vdpbf16ps" : "emulated"; }
void attention(const float* q, const KvSource& kv, const AttentionSeq* seqs, int64_t num_seqs, const AttentionDims& d,
               float* out, AttentionScratch& scratch, float* lse) {
  active().attention(q, kv, seqs, num_seqs, d, out, scratch, lse);
}
void rmsnorm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
  active().rmsnorm(x, rows, dim, w, eps, y);
}
void add_rmsnorm(float* x, const float* delta, int64_t rows, int64_t dim, const float* w, float eps, float* y) {
  active().add_rmsnorm(x, delta, rows, dim, w, eps, y);
}
void rope_sincos(const double* inv_freq, int64_t half, const int32_t* positions, int64_t n, bool f32_angle, float* cos,
                 float* sin) {
  active().rope_sincos(inv_freq, half, positions, n, f32_angle, cos, sin);
}
void rope_rotate(float* x, int64_t tokens, int64_t heads, int64_t head_stride, int64_t rot_offset, int64_t half,
                 const float* cos, const float* sin, RopePairing pairing, bool inverse) {
  active().rope_rotate(x, tokens, heads, head_stride, rot_offset, half, cos, sin, pairing, inverse);
}
void swiglu(const float* gate, const float* up, int64_t n, float* out) { active().swiglu(gate, up, n, out); }
void mul_sigmoid(float* x, const float* g, int64_t n) { active().mul_sigmoid(x, g, n); }
void add_inplace(float* y, const float* x, int64_t n) { active().add_inplace(y, x, n); }
void embedding(const void* table, DType dtype, int64_t dim, const int32_t* ids, int64_t n, float* out) {
  active().embedding(table, dtype, dim, ids, n, out);
}
void exp_values(const float* x, int64_t n, float* y) { active().exp_values(x, n, y); }
double logsumexp(const float* x, int64_t n) { return active().logsumexp(x, n); }
void log_softmax(const float* x, int64_t n, float* y) { active().log_softmax(x, n, y); }
void softmax(const float* x, int64_t n, float* y) { active().softmax(x, n, y); }
double cross_entropy_forward_backward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                      float label_smoothing, float grad_scale, float* row_loss, float* dlogits) {
  return active().cross_entropy_forward_backward(logits, targets, rows, vocab, label_smoothing, grad_scale, row_loss,
                                                 dlogits);
}
void token_logprobs(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float* logp) {
  active().token_logprobs(logits, targets, rows, vocab, logp);
}
void token_logprobs_backward(const float* logits, const int32_t* targets, const float* dlogp, int64_t rows,
                             int64_t vocab, float* dlogits) {
  active().token_logprobs_backward(logits, targets, dlogp, rows, vocab, dlogits);
}
void swiglu_backward(const float* dh, const float* a, const float* b, int64_t n, float* da, float* db) {
  active().swiglu_backward(dh, a, b, n, da, db);
}
void sigmoid_forward(const float* x, int64_t n, float* g) { active().sigmoid_forward(x, n, g); }
void rmsnorm_forward_train(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                           float* rstd) {
  active().rmsnorm_forward_train(x, w, rows, dim, eps, y, rstd);
}
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t rows, int64_t dim,
                      float* dx, bool accumulate_dx, float* dw) {
  active().rmsnorm_backward(dy, x, w, rstd, rows, dim, dx, accumulate_dx, dw);
}
void attention_forward_train(const float* q, const float* k, const float* v, const std::vector<AttnSpan>& spans,
                             const AttnShape& s, float* out, float* lse) {
  active().attention_forward_train(q, k, v, spans, s, out, lse);
}
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const std::vector<AttnSpan>& spans, const AttnShape& s, float* dq, float* dk,
                        float* dv) {
  active().attention_backward(dout, q, k, v, out, lse, spans, s, dq, dk, dv);
}
void linear_backward_f32(const float* dy, const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* dx,
                         bool accumulate_dx, float* dw, float* db) {
  active().linear_backward_f32(dy, x, m, w, n, k, dx, accumulate_dx, dw, db);
}

}  // namespace astrai::kernels
