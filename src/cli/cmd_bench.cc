// `astrai bench decode | prefill | prefix` (inference engine benchmarks; other files add more through
// cli/bench.h). Both run on a random-weight ~100M Llama-style model unless --model is given.
//
// decode: batch 1/8/32, prompt 512, generate 128. Reports aggregate decode tokens/s (after every
//   request has its first token), the bytes a decode step must stream (weights + KV read) per
//   second against a parallel memcpy probe measured in the same run, the batch-32 / batch-1
//   ratio, the share of the engine's forward passes spent in attention (timed inside them), and
//   the engine's own overhead (scheduling + sampling) as a share of the step. --kv-dtype bf16
//   stores the KV cache in bf16 (half the bytes attention reads).
// prefill: prompt processing, llama-bench's "pp" test as users run it: `--batches` requests of
//   --prompt tokens each submitted at once; prompt tokens per second until the last one has its
//   first token (best of --repeat runs), and the mean time to first token.
// prefix: 32 requests sharing a 1000-token prefix: time to first token and total time with the
//   prefix cache on and off.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/huge_buffer.h"
#include "base/json.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "cli/bench.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "infer/engine.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/peak.h"
#include "model/transformer.h"

namespace astrai::cli {

namespace {
std::vector<BenchSetup>& bench_registry() {
  static std::vector<BenchSetup> setups;
  return setups;
}
}  // namespace

bool register_bench(BenchSetup setup) {
  bench_registry().push_back(setup);
  return true;
}
const std::vector<BenchSetup>& registered_benches() { return bench_registry(); }

namespace {

// --cpu-time: on a shared, oversubscribed machine wall time mostly measures the OS scheduler
// (a 2-thread OpenMP region waits for whichever thread was descheduled). With it, a duration
// is the process CPU time divided by the thread count (run with OMP_WAIT_POLICY=passive so
// waiting threads sleep): an estimate of the wall time on a quiet machine.
bool g_cpu_time = false;

double now_seconds() {
  timespec ts;
  if (g_cpu_time) {
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec + ts.tv_nsec * 1e-9) / std::max(1, num_threads());
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Stopwatch on now_seconds().
class BenchTimer {
 public:
  BenchTimer() : start_(now_seconds()) {}
  double seconds() const { return now_seconds() - start_; }

 private:
  double start_;
};

struct BenchModelFlags {
  std::string model;
  int threads = 0;
  int layers = 12, hidden = 768, heads = 12, kv_heads = 4, ffn = 2048, vocab = 32000;
  bool no_mmap = false;
  std::string device = "cpu";
  void add(CLI::App* cmd) {
    cmd->add_option("--model", model, "Model directory or GGUF file (default: random-weight ~100M Llama-style model)");
    add_device_option(cmd, &device);
    add_no_mmap_flag(cmd, &no_mmap)->description("With --model: copy the weights into memory (2 MiB huge pages) "
                                                  "instead of memory-mapping them (the random model is always in memory)");
    cmd->add_option("--threads", threads, "Threads (default: all cores)");
    cmd->add_option("--layers", layers, "Random model: layers");
    cmd->add_option("--hidden", hidden, "Random model: hidden size");
    cmd->add_option("--vocab", vocab, "Random model: vocabulary");
    cmd->add_flag("--cpu-time", g_cpu_time, "Time by process CPU time / threads (for a loaded machine)");
  }
};

std::shared_ptr<const model::Transformer> bench_model(const BenchModelFlags& f) {
  if (f.threads > 0) set_num_threads(f.threads);
  if (!f.model.empty())
    return std::make_shared<const model::Transformer>(
        model::Transformer::load(f.model, weight_placement(f.no_mmap), parse_device(f.device)));
  Json j = {{"model_type", "llama"},          {"vocab_size", f.vocab},           {"hidden_size", f.hidden},
            {"intermediate_size", f.ffn},     {"num_hidden_layers", f.layers},   {"num_attention_heads", f.heads},
            {"num_key_value_heads", f.kv_heads}, {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},          {"tie_word_embeddings", true},     {"hidden_act", "silu"}};
  model::ModelConfig config = model::ModelConfig::from_json(j, "bench model");
  model::ModelWeights w = model::ModelWeights::allocate(config, DType::kF32);
  uint64_t state = 0x1234567;
  for (auto& p : w.params(config)) {
    float* d = p.tensor->data<float>();
    const int64_t n = p.tensor->numel();
    const bool norm = p.shape.size() == 1;
    const float a = norm ? 0.0f : std::sqrt(3.0f / static_cast<float>(p.shape.back()));
    for (int64_t i = 0; i < n; ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      d[i] = norm ? 1.0f : a * (static_cast<float>(state >> 40) * 0x1.0p-23f * 2.0f - 1.0f);
    }
  }
  return std::make_shared<const model::Transformer>(config, std::move(w), parse_device(f.device));
}

// A device-to-device copy of 1 GiB: bytes read + bytes written per second (best of 5).
double device_copy_bandwidth(const backend::Ops& ops) {
  const size_t bytes = size_t(1) << 30;
  void* a = ops.alloc(bytes);
  void* b = ops.alloc(bytes);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    ops.synchronize();
    BenchTimer t;
    ops.copy_bytes(b, a, bytes);
    ops.synchronize();
    if (rep > 0) best = std::max(best, 2.0 * double(bytes) / t.seconds());
  }
  ops.release(a);
  ops.release(b);
  return best;
}

// Parallel memcpy of a buffer much larger than the caches, in huge-page memory as the weights
// and the KV pool are: bytes read + bytes written per second (the STREAM convention).
double copy_bandwidth() {
  const size_t n = size_t(64) << 20;  // 256 MiB of floats each way
  HugeBuffer src(n), dst(n);
  parallel_for(0, 64, [&](int64_t c) {  // first touch by the threads that copy
    std::fill(src.data() + n / 64 * c, src.data() + n / 64 * (c + 1), 1.0f);
    std::fill(dst.data() + n / 64 * c, dst.data() + n / 64 * (c + 1), 0.0f);
  });
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    BenchTimer t;
    parallel_for(0, 64, [&](int64_t c) {
      std::memcpy(dst.data() + n / 64 * c, src.data() + n / 64 * c, n / 64 * sizeof(float));
    });
    best = std::max(best, 2.0 * double(n * sizeof(float)) / t.seconds());
  }
  return best;
}

std::vector<int32_t> random_ids(uint64_t seed, int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (auto& t : ids) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((seed >> 33) % uint64_t(vocab));
  }
  return ids;
}

struct RunStats {
  double decode_tps = 0;       // aggregate tokens/s while every request of the batch decodes
  double step_seconds = 0;     // mean decode step
  double overhead_share = 0;   // scheduling + sampling / step (whole run)
  double attention_share = 0;  // attention / forward time over the decode phase (in-step profile)
  model::ForwardProfile decode_profile;  // per-operation forward time over the decode phase
  model::ForwardProfile run_profile;     // per-operation forward time over the whole run
  double forward_ms = 0;        // mean forward pass of a decode-phase engine step
  double mean_ttft = 0, total_seconds = 0;
  uint64_t cache_hits = 0;
  DType kv_dtype = DType::kF32;
};

// The forward profile between two snapshots of an engine's cumulative one.
model::ForwardProfile profile_between(const model::ForwardProfile& a, const model::ForwardProfile& z) {
  model::ForwardProfile d;
  d.forwards = z.forwards - a.forwards;
  for (size_t i = 0; i < z.seconds.size(); ++i) d.seconds[i] = z.seconds[i] - a.seconds[i];
  return d;
}

// The matrix products of a profiled stretch of forwards (q/k/v, o, gate+up, down and the LM
// head: their multiply-adds over the time of those operations) against the arithmetic peak of
// the instruction they are built from: the 8-bit dot product for quantized weights times q8
// activations, VDPBF16PS for bf16 weights in the bf16-dot mode where the CPU runs it, else the
// f32 fused multiply-add (f32, and 16-bit weights widened to f32).
// The probe is taken again before each batch's figures and each rate kept at its best: another
// tenant taking one of the cores during a probe of a fraction of a second halves a two-thread
// rate (seen in compare.py runs on shared 2-vCPU machines), and a peak read low would make the
// products look closer to it than they are.
struct Products {
  enum class Unit { kF32, kInt8, kBf16 };
  Unit which = Unit::kF32;
  const char* unit = "f32 FMA";
  double peak = 0;  // operations per second
  kernels::PeakRates rates;
  std::string peak_line;

  static Products measure(const model::Transformer& m) {
    Products p;
    p.rates = kernels::peak_rates(num_threads());
    const bool quantized = share_of(m, [](DType t) { return is_block_type(t); }) > 0.5;
    const bool bf16 = share_of(m, [](DType t) { return t == DType::kBF16; }) > 0.5;
    if (quantized && kernels::activations() == kernels::Activations::kQ8) {
      p.which = Unit::kInt8;
      p.unit = "int8 dot";
    } else if (bf16 && kernels::bf16_dot() && p.rates.bf16_flops > 0) {
      p.which = Unit::kBf16;
      p.unit = "bf16 dot";
    }
    p.update();
    return p;
  }
  // Probes again; every rate keeps the higher of the two readings.
  void refresh() {
    const kernels::PeakRates r = kernels::peak_rates(num_threads());
    rates.f32_flops = std::max(rates.f32_flops, r.f32_flops);
    rates.int8_ops = std::max(rates.int8_ops, r.int8_ops);
    rates.bf16_flops = std::max(rates.bf16_flops, r.bf16_flops);
    update();
  }
  // The products' operations and seconds over `prof`, which ran `rows` rows through the layers
  // and `logit_rows` through the LM head.
  struct Work {
    double ops = 0, seconds = 0;
    double rate() const { return seconds > 0 ? ops / seconds : 0.0; }
  };
  static Work work(const model::Transformer& m, const model::ForwardProfile& prof, double rows, double logit_rows) {
    using model::ForwardOp;
    Work w;
    for (ForwardOp op : {ForwardOp::kQkvProj, ForwardOp::kOutProj, ForwardOp::kMlpIn, ForwardOp::kMlpDown,
                         ForwardOp::kLmHead})
      w.seconds += prof.seconds[static_cast<size_t>(op)];
    w.ops = 2.0 * (rows * static_cast<double>(m.layer_macs_per_token()) +
                   logit_rows * static_cast<double>(m.lm_head_macs_per_row()));
    return w;
  }
  void update() {
    peak = which == Unit::kInt8 ? rates.int8_ops : which == Unit::kBf16 ? rates.bf16_flops : rates.f32_flops;
    peak_line = kernels::peak_summary(rates);
  }
  std::string describe(double rate) const {
    if (peak <= 0)  // e.g. quantized weights on a neon CPU without sdot: no loop of their instructions
      return str_cat(static_cast<int64_t>(rate / 1e9), " GOP/s (no ", unit, " peak on this CPU)");
    return str_cat(static_cast<int64_t>(rate / 1e9), " GOP/s, ", static_cast<int>(100 * rate / peak + 0.5), "% of the ",
                   unit, " peak");
  }

 private:
  // The share of the layers' matrices (and a tied LM head) whose dtype passes `is`.
  template <typename Is>
  static double share_of(const model::Transformer& m, Is&& is) {
    double all = 0, yes = 0;
    for (const auto& w : m.weights().params(m.config())) {
      if (w.shape.size() != 2 || (w.name == "model.embed_tokens.weight" && !m.config().tie_word_embeddings)) continue;
      const double n = static_cast<double>(w.tensor->numel());
      all += n;
      if (is(w.tensor->dtype())) yes += n;
    }
    return all > 0 ? yes / all : 0.0;
  }
};

// The engine options a bench command takes from its flags (--kv-dtype, --sample-on).
struct EngineChoice {
  std::string kv_dtype = "auto";
  std::string sample_on = "auto";
  void add(CLI::App* cmd) {
    add_kv_dtype_option(cmd, &kv_dtype);
    add_sample_on_option(cmd, &sample_on);
  }
};

// An engine for `batch` requests of prompt_len (+ shared_prefix_len) + gen tokens.
std::unique_ptr<infer::Engine> bench_engine(const std::shared_ptr<const model::Transformer>& m, int batch,
                                            int prompt_len, int gen, bool prefix_cache, const EngineChoice& choice,
                                            size_t shared_prefix_len = 0) {
  infer::EngineOptions o;
  o.max_running = std::max(batch, 1);
  o.max_step_tokens = 2048;
  o.prefix_cache = prefix_cache;
  o.kv_dtype = choice.kv_dtype;
  o.sample_on = choice.sample_on;
  o.prefault_kv = true;  // as a server's (and llama.cpp's cleared) cache: page faults are not the work measured
  const int64_t tokens = int64_t(batch) * (prompt_len + int64_t(shared_prefix_len) + gen + 32);
  // Sized for f32 elements: bf16 gets twice the pages it needs, never too few.
  o.kv_cache_bytes = std::max<int64_t>(tokens * m->kv_bytes_per_token(DType::kF32), 64 << 20);
  return std::make_unique<infer::Engine>(m, nullptr, o);
}

// One run of `batch` requests on `engine` (bench_engine's shape); the stats are this run's alone.
RunStats run_on(infer::Engine& engine, const std::shared_ptr<const model::Transformer>& m, int batch, int prompt_len,
                int gen, const std::vector<int32_t>& shared_prefix = {}) {
  const infer::EngineStats start = engine.stats();
  BenchTimer clock;
  std::vector<infer::RequestHandle> handles;
  // Callbacks run on the engine thread, one at a time; the main thread reads these after
  // wait(). The decode window starts in the step after the one that gives the last request its
  // first token and ends at the step in which the first request finishes: every step inside
  // it is a pure decode step of the whole batch. Snapshots are taken at the same point of a
  // step (during its sampling), so their time difference is a whole number of steps; the
  // engine counts a step's forward before it samples, so the snapshots' forward times cover
  // the forwards of exactly those steps.
  std::vector<double> first_at(batch, -1.0);
  int have_first = 0;
  uint64_t open_step = 0;  // steps completed before the step that completed the first tokens
  bool opened = false, closed = false;
  double t_open = 0, t_close = 0;
  infer::EngineStats at_open, at_close;
  for (int b = 0; b < batch; ++b) {
    infer::GenerationRequest r;
    r.prompt_ids = shared_prefix;
    auto tail = random_ids(1000 + b, prompt_len, static_cast<int>(m->vocab_size()));
    r.prompt_ids.insert(r.prompt_ids.end(), tail.begin(), tail.end());
    r.sampling.temperature = 0;
    r.sampling.max_tokens = gen;
    r.sampling.ignore_eos = true;
    handles.push_back(engine.submit(std::move(r), [&, batch, b](const infer::ChoiceDelta& d) {
      const double now = clock.seconds();
      if (first_at[b] < 0) {
        first_at[b] = now;
        if (++have_first == batch) open_step = engine.stats().steps;
        return;
      }
      if (have_first < batch || closed) return;
      if (!opened) {
        const infer::EngineStats st = engine.stats();
        if (st.steps > open_step) at_open = st, t_open = now, opened = true;
      }
      if (opened && d.finish != infer::FinishReason::kNone) at_close = engine.stats(), t_close = now, closed = true;
    }));
  }
  RunStats s;
  s.kv_dtype = engine.kv_dtype();
  double ttft = 0;
  for (auto& h : handles) {
    auto r = h.wait();
    ASTRAI_CHECK(r.error.empty(), "bench: ", r.error);
  }
  for (double t : first_at) ttft += t;
  s.total_seconds = clock.seconds();
  s.mean_ttft = ttft / batch;
  const auto st = engine.stats();
  s.cache_hits = st.prefix_cache_hit_tokens - start.prefix_cache_hit_tokens;
  s.run_profile = profile_between(start.forward_profile, st.forward_profile);
  const double schedule = st.schedule_seconds - start.schedule_seconds, sample = st.sample_seconds - start.sample_seconds;
  const double step_total = schedule + (st.forward_seconds - start.forward_seconds) + sample;
  s.overhead_share = step_total > 0 ? (schedule + sample) / step_total : 0;
  if (closed && at_close.steps > at_open.steps) {
    const double steps = double(at_close.steps - at_open.steps);
    const double forward = at_close.forward_seconds - at_open.forward_seconds;
    s.step_seconds = (t_close - t_open) / steps;
    s.decode_tps = batch / s.step_seconds;
    s.forward_ms = 1e3 * forward / steps;
    s.decode_profile = profile_between(at_open.forward_profile, at_close.forward_profile);
    const double attention = s.decode_profile.seconds[static_cast<size_t>(model::ForwardOp::kAttention)];
    if (forward > 0) s.attention_share = attention / forward;
  }
  return s;
}

// One run on an engine of its own.
RunStats run_batch(const std::shared_ptr<const model::Transformer>& m, int batch, int prompt_len, int gen,
                   bool prefix_cache, const EngineChoice& choice, const std::vector<int32_t>& shared_prefix = {}) {
  auto engine = bench_engine(m, batch, prompt_len, gen, prefix_cache, choice, shared_prefix.size());
  return run_on(*engine, m, batch, prompt_len, gen, shared_prefix);
}

struct DecodeFlags {
  BenchModelFlags model;
  int prompt = 512, gen = 128;
  std::vector<int> batches = {1, 8, 32};
  EngineChoice engine;
  bool json = false;
  bool profile = false;
};

void run_decode(const DecodeFlags& f) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up line by line in logs
  auto m = bench_model(f.model);
  const double weight_bytes = static_cast<double>(m->weight_bytes());
  std::printf("model: %.1fM parameters, %.0f MB of weights (%s); %d threads\n", m->num_parameters() / 1e6,
              weight_bytes / 1e6, m->mapped_bytes() > 0 ? "memory-mapped" : "in memory", num_threads());
  const bool on_cpu = m->device() == Device::kCpu;
  const double bw = on_cpu ? copy_bandwidth() : device_copy_bandwidth(backend::ops_for(m->device()));
  std::printf("copy-bandwidth probe (%s): %.1f GB/s read + written\n",
              on_cpu ? "parallel memcpy, huge pages" : "device-to-device copy of 1 GiB", bw / 1e9);
  Products products;
  if (on_cpu) {
    products = Products::measure(*m);
    std::printf("arithmetic peak (register-only loops): %s\n", products.peak_line.c_str());
  }
  const kernels::CpuInfo& cpu = kernels::cpu_info();
  const std::string level(kernels::isa_name(kernels::active_isa()));
  if (on_cpu)
    std::printf("cpu: %s, kernels %s, quantized weights times %s activations, bf16 dot %s\n",
                cpu.model.empty() ? cpu.arch.c_str() : cpu.model.c_str(), level.c_str(),
                kernels::activations_name(kernels::activations()), kernels::bf16_dot_name());
  else
    std::printf("device: cuda (the attention share is not measured there: kernels run asynchronously)\n");
  Json report = {{"params", m->num_parameters()}, {"weight_bytes", weight_bytes}, {"copy_bw", bw},
                 {"cpu", cpu.model}, {"kernels", level}, {"device", on_cpu ? "cpu" : "cuda"},
                 {"activations", kernels::activations_name(kernels::activations())},
                 {"bf16_dot", kernels::bf16_dot_name()}, {"sample_on", f.engine.sample_on}};
  double tps1 = 0;
  for (int b : f.batches) {
    RunStats s = run_batch(m, b, f.prompt, f.gen, false, f.engine);
    if (b == f.batches.front()) {
      std::printf("KV cache: %s\n", std::string(dtype_name(s.kv_dtype)).c_str());
      report["kv_dtype"] = std::string(dtype_name(s.kv_dtype));
    }
    // One decode step reads every weight once plus each sequence's K/V (context ~prompt + gen/2).
    const double ctx = f.prompt + f.gen / 2.0;
    const double kv_bytes = double(b) * ctx * m->kv_bytes_per_token(s.kv_dtype);
    const double bytes_per_s = (weight_bytes + kv_bytes) / s.step_seconds;
    if (b == 1) tps1 = s.decode_tps;
    std::printf(
        "batch %2d: %8.1f tok/s  step %6.1f ms (forward %6.1f ms)  %6.1f GB/s streamed (%3.0f%% of copy bw)  attention %4.1f%% of forward  "
        "engine overhead %4.2f%%%s\n",
        b, s.decode_tps, s.step_seconds * 1e3, s.forward_ms, bytes_per_s / 1e9, 100 * bytes_per_s / bw,
        on_cpu ? 100 * s.attention_share : 0.0, 100 * s.overhead_share,
        (b != 1 && tps1 > 0) ? str_cat("  (", static_cast<int>(s.decode_tps / tps1 * 10) / 10.0, "x batch 1)").c_str()
                             : "");
    // Every decode-phase step runs b rows through the layers and the LM head; per forward:
    const double fw = std::max<double>(1, static_cast<double>(s.decode_profile.forwards));
    const Products::Work pw = on_cpu ? Products::work(*m, s.decode_profile, b * fw, b * fw) : Products::Work{};
    // Attention reads each sequence's K/V once per step (the same mean context as above).
    const double attention_s = s.decode_profile.seconds[static_cast<size_t>(model::ForwardOp::kAttention)] / fw;
    const double kv_rate = attention_s > 0 ? kv_bytes / attention_s : 0.0;
    if (on_cpu) {
      products.refresh();
      std::printf("          matrix products: %s; attention: %.1f ms, %.1f GB/s of K/V\n",
                  products.describe(pw.rate()).c_str(), attention_s * 1e3, kv_rate / 1e9);
    }
    if (f.profile) std::printf("%s", s.decode_profile.table().c_str());
    report["batches"].push_back({{"batch", b},
                                 {"products_ops", pw.ops / fw},
                                 {"products_ms", pw.seconds / fw * 1e3},
                                 {"attention_ms", attention_s * 1e3},
                                 {"kv_bytes", kv_bytes},
                                 {"tokens_per_s", s.decode_tps},
                                 {"step_ms", s.step_seconds * 1e3},
                                 {"forward_ms", s.forward_ms},
                                 {"bytes_per_s", bytes_per_s},
                                 {"attention_share", s.attention_share},
                                 {"overhead_share", s.overhead_share}});
  }
  if (on_cpu) {  // the best of the probes, as every batch's share above was last reckoned against
    std::printf("arithmetic peak, best of the probes: %s\n", products.peak_line.c_str());
    report["products_peak"] = products.peak;
  }
  if (f.json) std::printf("%s\n", report.dump().c_str());
}

struct PrefillFlags {
  BenchModelFlags model;
  int prompt = 512;
  int repeat = 3;
  std::vector<int> batches = {1};
  EngineChoice engine;
  bool json = false;
  bool profile = false;
};

void run_prefill(const PrefillFlags& f) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ASTRAI_CHECK(f.prompt > 0 && f.repeat > 0, "bench prefill: --prompt and --repeat must be positive");
  auto m = bench_model(f.model);
  const kernels::CpuInfo& cpu = kernels::cpu_info();
  const bool on_cpu = m->device() == Device::kCpu;
  const std::string level = on_cpu ? std::string(kernels::isa_name(kernels::active_isa())) : "cuda";
  const char* acts = kernels::activations_name(kernels::activations());
  std::printf("model: %.1fM parameters, %.0f MB of weights; %d threads; cpu: %s, kernels %s; quantized weights "
              "times %s activations; bf16 dot %s\n",
              m->num_parameters() / 1e6, static_cast<double>(m->weight_bytes()) / 1e6, num_threads(),
              cpu.model.empty() ? cpu.arch.c_str() : cpu.model.c_str(), level.c_str(), acts, kernels::bf16_dot_name());
  Json report = {{"params", m->num_parameters()}, {"weight_bytes", static_cast<double>(m->weight_bytes())},
                 {"cpu", cpu.model}, {"kernels", level}, {"prompt", f.prompt}, {"activations", acts},
                 {"bf16_dot", kernels::bf16_dot_name()}};
  Products products;
  if (on_cpu) {
    products = Products::measure(*m);
    std::printf("arithmetic peak (register-only loops): %s\n", products.peak_line.c_str());
  }
  for (int b : f.batches) {
    ASTRAI_CHECK(b > 0, "bench prefill: batch sizes must be positive (got ", b, ")");
    RunStats best;
    // Every repeat on one engine, as llama-bench reuses its context: the forward's workspace is
    // sized (and its pages faulted in) by the first run, as a server's is by its first prompts.
    // The prefix cache is off, so each run computes its whole prompt.
    auto engine = bench_engine(m, b, f.prompt, 1, false, f.engine);
    for (int r = 0; r < f.repeat; ++r) {  // one generated token: the run ends when every prompt is processed
      RunStats s = run_on(*engine, m, b, f.prompt, 1);
      if (r == 0 || s.total_seconds < best.total_seconds) best = s;
    }
    const double tps = double(b) * f.prompt / best.total_seconds;
    std::printf("batch %2d x %d tokens: %8.1f prompt tok/s  (%.3f s; mean time to first token %.3f s; best of %d)\n", b,
                f.prompt, tps, best.total_seconds, best.mean_ttft, f.repeat);
    // The run's forwards took b prompts through the layers and one row each through the LM head.
    const Products::Work pw =
        on_cpu ? Products::work(*m, best.run_profile, double(b) * f.prompt, double(b)) : Products::Work{};
    const double products_rate = pw.rate();
    const double attention_s = best.run_profile.seconds[static_cast<size_t>(model::ForwardOp::kAttention)];
    if (on_cpu) {
      products.refresh();
      std::printf("          matrix products: %s\n", products.describe(products_rate).c_str());
    }
    if (f.profile) std::printf("%s", best.run_profile.table().c_str());
    report["batches"].push_back({{"batch", b}, {"tokens_per_s", tps}, {"seconds", best.total_seconds},
                                 {"mean_ttft", best.mean_ttft}, {"products_ops_per_s", products_rate},
                                 {"products_ops", pw.ops}, {"products_ms", pw.seconds * 1e3},
                                 {"attention_ms", attention_s * 1e3}});
  }
  if (on_cpu) {  // the best of the probes, as every batch's share above was last reckoned against
    std::printf("arithmetic peak, best of the probes: %s\n", products.peak_line.c_str());
    report["products_peak"] = products.peak;
  }
  if (f.json) std::printf("%s\n", report.dump().c_str());
}

struct PrefixFlags {
  BenchModelFlags model;
  int requests = 32, prefix = 1000, suffix = 24, gen = 16;
  EngineChoice engine;
};

void run_prefix(const PrefixFlags& f) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto m = bench_model(f.model);
  std::printf("model: %.1fM parameters; %d threads; %d requests, %d-token shared prefix + %d own, generate %d\n",
              m->num_parameters() / 1e6, num_threads(), f.requests, f.prefix, f.suffix, f.gen);
  const auto prefix = random_ids(7, f.prefix, static_cast<int>(m->vocab_size()));
  for (bool on : {true, false}) {
    RunStats s = run_batch(m, f.requests, f.suffix, f.gen, on, f.engine, prefix);
    std::printf("prefix cache %-3s: mean TTFT %7.2f s  total %7.2f s  cache hit tokens %llu\n", on ? "on" : "off",
                s.mean_ttft, s.total_seconds, static_cast<unsigned long long>(s.cache_hits));
  }
}

void setup_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto d = std::make_shared<DecodeFlags>();
  auto* dec = bench->add_subcommand("decode", "Batched decode throughput of the inference engine");
  d->model.add(dec);
  dec->add_option("--prompt", d->prompt, "Prompt tokens per request");
  dec->add_option("--gen", d->gen, "Generated tokens per request");
  dec->add_option("--batches", d->batches, "Batch sizes (1,8,32 or 1 8 32)")->delimiter(',');
  d->engine.add(dec);
  dec->add_flag("--json", d->json, "Also print a JSON report");
  dec->add_flag("--profile", d->profile, "Print where each decode step's forward time goes, per operation");
  dec->callback([d] { run_decode(*d); });
  auto pf = std::make_shared<PrefillFlags>();
  auto* fill = bench->add_subcommand("prefill", "Prompt processing throughput of the inference engine (llama-bench's pp)");
  pf->model.add(fill);
  fill->add_option("--prompt", pf->prompt, "Prompt tokens per request")->check(CLI::PositiveNumber);
  fill->add_option("--batches", pf->batches, "Requests submitted at once, each size a run of its own (1,8 or 1 8)")->delimiter(',');
  fill->add_option("--repeat", pf->repeat, "Runs per batch size; the fastest is reported")->check(CLI::PositiveNumber);
  pf->engine.add(fill);
  fill->add_flag("--json", pf->json, "Also print a JSON report");
  fill->add_flag("--profile", pf->profile, "Print where the fastest run's forward time goes, per operation");
  fill->callback([pf] { run_prefill(*pf); });
  auto p = std::make_shared<PrefixFlags>();
  auto* pre = bench->add_subcommand("prefix", "Shared-prefix workload, prefix cache on vs off");
  p->model.add(pre);
  pre->add_option("--requests", p->requests);
  pre->add_option("--prefix", p->prefix, "Shared prefix tokens");
  pre->add_option("--suffix", p->suffix, "Own tokens per request");
  pre->add_option("--gen", p->gen, "Generated tokens per request");
  p->engine.add(pre);
  pre->callback([p] { run_prefix(*p); });
  for (auto setup : registered_benches()) setup(*bench);
}

const bool kRegistered = register_command(&setup_bench);

}  // namespace
}  // namespace astrai::cli
