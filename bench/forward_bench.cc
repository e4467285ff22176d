// Forward-pass benchmark on a ~110M-parameter Llama-style model with random weights
// (hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000). Reports numbers, never
// passes or fails:
//   prefill: batch x length grid, tokens/s and GFLOP/s, next to the OpenBLAS SGEMM rate and
//            our linear kernel's rate measured in this run on the forward's own GEMM shapes;
//   decode:  single-token steps for batch 1 and 8 (128 tokens of context in a paged KV
//            cache), weight bytes read per second next to a copy probe run in this process.
// Usage: see kUsage below (forward_bench --help).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/huge_buffer.h"
#include "bench_probes.h"
#include "kernels/cpu/matmul.h"
#include "model/transformer.h"
#include "tensor/dtype.h"

using namespace astrai;

namespace {

model::ModelConfig bench_config(int64_t kv_heads) {
  Json j = {{"model_type", "llama"},         {"vocab_size", 32000},         {"hidden_size", 768},
            {"intermediate_size", 2048},     {"num_hidden_layers", 12},     {"num_attention_heads", 12},
            {"num_key_value_heads", kv_heads},     {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},         {"tie_word_embeddings", false}};
  return model::ModelConfig::from_json(j, "forward_bench config");
}

// Random weights (std 0.02, norms 1) in `dtype`, filled with a cheap generator.
model::ModelWeights random_weights(const model::ModelConfig& config, DType dtype) {
  model::ModelWeights w = model::ModelWeights::allocate(config, dtype);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (auto& p : w.params(config)) {
    const bool is_norm = p.shape.size() == 1;
    const int64_t n = shape_numel(p.shape);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& f : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / (1 << 23);
      f = is_norm ? 1.0f : 0.035f * u;  // uniform with std ~0.02
    }
    convert_from_f32(v.data(), dtype, p.tensor->raw(), static_cast<size_t>(n));
  }
  return w;
}

struct GemmShape {
  int64_t n, k, count;  // weight [n, k], used `count` times per forward
};

// The forward's linear layers for `rows` tokens (the LM head runs on `logit_rows` rows).
std::vector<std::pair<int64_t, GemmShape>> forward_gemms(const model::ModelConfig& c, int64_t rows,
                                                         int64_t logit_rows) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, L = c.num_hidden_layers;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  counts[{q, h}] += L;
  counts[{kv, h}] += 2 * L;
  counts[{h, q}] += L;
  counts[{f, h}] += 2 * L;
  counts[{h, f}] += L;
  std::vector<std::pair<int64_t, GemmShape>> out;
  for (const auto& [nk, cnt] : counts) out.push_back({rows, GemmShape{nk.first, nk.second, cnt}});
  out.push_back({logit_rows, GemmShape{c.vocab_size, h, 1}});
  return out;
}

double gemm_flops(const std::vector<std::pair<int64_t, GemmShape>>& gemms) {
  double fl = 0;
  for (const auto& [m, g] : gemms) fl += 2.0 * m * g.n * g.k * g.count;
  return fl;
}

// Seconds the given GEMMs take with OpenBLAS sgemm and with kernels::linear (f32 weights).
std::pair<double, double> gemm_seconds(const std::vector<std::pair<int64_t, GemmShape>>& gemms, double t_min) {
  double blas = 0, ours = 0;
  for (const auto& [m, g] : gemms) {
    const double fl = 2.0 * m * g.n * g.k;
    blas += g.count * fl / (bench::sgemm_gflops(m, g.n, g.k, t_min) * 1e9);
    const auto x = bench::random_floats(static_cast<size_t>(m * g.k), 7);
    const auto w = bench::random_floats(static_cast<size_t>(g.n * g.k), 8, 0.05f);
    bench::Floats y(static_cast<size_t>(m * g.n));
    const kernels::WeightView view{w.data(), DType::kF32, g.n, g.k};
    ours += g.count * bench::best_seconds([&] { kernels::linear(x.data(), m, view, nullptr, y.data()); }, t_min);
  }
  return {blas, ours};
}

// Attention FLOPs of causal prefill (QK^T and PV) for `batch` sequences of `len` tokens
// after `ctx` cached tokens.
double attention_flops(const model::ModelConfig& c, int64_t batch, int64_t len, int64_t ctx) {
  double pairs = 0;
  for (int64_t j = 0; j < len; ++j) pairs += static_cast<double>(ctx + j + 1);
  return 4.0 * batch * pairs * c.num_attention_heads * c.head_dim * c.num_hidden_layers;
}

}  // namespace

constexpr const char* kUsage =
    "usage: forward_bench [--quick] [--dtype f32|bf16|both] [--threads N] [--cpu-time]\n"
    "                     [--decode-only] [--ctx N] [--decode-batches 1,8,32] [--kv-heads N]\n"
    "                     [--page-size P] [--kv-dtype f32|bf16] [--profile]\n"
    "  --quick           shorter timing runs\n"
    "  --dtype           weight dtype(s) of the random model (default both)\n"
    "  --threads N       OpenMP threads (default 2)\n"
    "  --cpu-time        time by process CPU time / threads, for a busy machine (run with\n"
    "                    OMP_WAIT_POLICY=passive; see bench/bench_probes.h)\n"
    "  --decode-only     skip the prefill grid\n"
    "  --ctx N           decode: cached tokens per sequence (default 128)\n"
    "  --decode-batches  decode: comma-separated batch sizes (default 1,8)\n"
    "  --kv-heads N      KV heads of the model (default 12: MHA)\n"
    "  --page-size P     decode: KV page size (default 16)\n"
    "  --kv-dtype        decode: KV cache elements (default f32)\n"
    "  --profile         print where each forward's time goes (model/forward_profile.h)\n";

int main(int argc, char** argv) {
  astrai::kernels::reexec_for_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  bool quick = false;
  std::string dtypes = "both";
  int threads = 2;
  bool decode_only = false, profile = false;
  int64_t ctx = 128;
  int64_t kv_heads = 12;
  int page_size = 16;  // decode: KV page size
  DType kv_dtype = DType::kF32;  // decode: KV cache elements (--kv-dtype bf16)
  std::vector<int64_t> decode_batches = {1, 8};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--dtype" && has_value) {
      dtypes = argv[++i];
      if (dtypes != "f32" && dtypes != "bf16" && dtypes != "both") return bench::usage_error(kUsage, "--dtype " + dtypes);
    } else if (a == "--threads" && has_value) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--cpu-time") {
      bench::clock_mode() = bench::Clock::kCpu;
    } else if (a == "--decode-only") {
      decode_only = true;
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--ctx" && has_value) {
      ctx = std::atoll(argv[++i]);
    } else if (a == "--kv-heads" && has_value) {
      kv_heads = std::atoll(argv[++i]);
    } else if (a == "--page-size" && has_value) {
      page_size = std::atoi(argv[++i]);
    } else if (a == "--kv-dtype" && has_value) {
      const std::string v = argv[++i];
      if (v != "f32" && v != "bf16") return bench::usage_error(kUsage, "--kv-dtype " + v);
      kv_dtype = v == "bf16" ? DType::kBF16 : DType::kF32;
    } else if (a == "--decode-batches" && has_value) {
      decode_batches.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        decode_batches.push_back(std::strtoll(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
      }
    } else {
      return bench::usage_error(kUsage, a);
    }
  }
  set_num_threads(threads);
  const double t_min = quick ? 0.05 : 0.2;
  const model::ModelConfig config = bench_config(kv_heads);

  std::printf("cpu: %s\n", bench::cpu_and_level().c_str());
  std::printf("load average at the start: %s; clock: %s\n", bench::load_average().c_str(),
              bench::clock_mode() == bench::Clock::kCpu ? "process CPU time / threads (--cpu-time)" : "wall");
  const bench::CopyBandwidth bw = bench::copy_bandwidth();
  std::printf("threads=%d  copy probe %.1f GB/s (read+write), streaming read %.1f GB/s\n", threads, bw.copy_gbs,
              bw.read_gbs);

  std::vector<DType> types;
  if (dtypes == "f32" || dtypes == "both") types.push_back(DType::kF32);
  if (dtypes == "bf16" || dtypes == "both") types.push_back(DType::kBF16);

  std::vector<std::pair<int64_t, int64_t>> grid = {{1, 128}, {1, 512}, {4, 128}, {4, 512}, {8, 512}};
  if (quick) grid = {{1, 128}, {1, 512}};
  if (decode_only) grid.clear();

  // GEMM ceilings on the forward's shapes, measured once (f32 activations; weights f32).
  struct Ceiling { double blas_gflops, ours_gflops, linear_flops; };
  std::map<std::pair<int64_t, int64_t>, Ceiling> ceilings;
  for (const auto& [b, len] : grid) {
    const auto gemms = forward_gemms(config, b * len, b);
    const auto [blas_s, ours_s] = gemm_seconds(gemms, t_min);
    const double fl = gemm_flops(gemms);
    ceilings[{b, len}] = {fl / blas_s / 1e9, fl / ours_s / 1e9, fl};
  }

  for (DType dtype : types) {
    model::Transformer model(config, random_weights(config, dtype));
    std::printf("\n== %s weights: %s, %.1fM parameters, %.0f MB ==\n", std::string(dtype_name(dtype)).c_str(),
                config.summary().c_str(), model.num_parameters() / 1e6, model.weight_bytes() / 1e6);
    model::ForwardWorkspace ws;

    std::printf("prefill (logits of each sequence's last token):\n");
    std::printf("%5s %5s | %9s %8s | %10s %10s | %8s %8s\n", "batch", "len", "tokens/s", "GFLOP/s", "blas GF/s",
                "linear GF/s", "%blas", "%linear");
    for (const auto& [b, len] : grid) {
      model::Batch batch;
      for (int64_t s = 0; s < b; ++s) {
        std::vector<int32_t> ids(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((s * 7919 + i * 31) % 32000);
        batch.add_sequence(ids);
        batch.logit_rows.push_back(static_cast<int32_t>((s + 1) * len - 1));
      }
      std::vector<float> logits(static_cast<size_t>(b * config.vocab_size));
      const double s = bench::best_seconds([&] { model.forward(batch, nullptr, ws, logits.data()); }, t_min, 2);
      ws.profile.reset();
      ws.profile.enabled = true;
      model.forward(batch, nullptr, ws, logits.data());
      ws.profile.enabled = false;
      const Ceiling& c = ceilings[{b, len}];
      const double flops = c.linear_flops + attention_flops(config, b, len, 0);
      const double gf = flops / s / 1e9;
      std::printf("%5ld %5ld | %9.0f %8.1f | %10.1f %10.1f | %7.0f%% %7.0f%%\n", static_cast<long>(b),
                  static_cast<long>(len), b * len / s, gf, c.blas_gflops, c.ours_gflops, 100 * gf / c.blas_gflops,
                  100 * gf / c.ours_gflops);
      if (profile) std::printf("%s", ws.profile.table().c_str());
    }

    // Decode: one new token per sequence after `ctx` cached tokens.
    std::printf("decode (one token per sequence, %ld tokens of context, %s KV cache):\n", static_cast<long>(ctx),
                std::string(dtype_name(kv_dtype)).c_str());
    std::printf("%5s | %9s %9s | %10s %8s\n", "batch", "ms/step", "tokens/s", "weight GB/s", "%copy");
    size_t weight_bytes = 0;
    for (const auto& p : model.weights().params(config))
      if (p.shape.size() == 2 && p.name.find("embed_tokens") == std::string::npos) weight_bytes += p.tensor->nbytes();
    if (config.tie_word_embeddings) weight_bytes += model.weights().lm_head.nbytes();
    for (int64_t b : decode_batches) {
      model::PagedKv kv = model.kv_geometry(page_size, kv_dtype);
      const int64_t pages_per_seq = (ctx + 1 + kv.page_size - 1) / kv.page_size;
      const size_t page_elems = static_cast<size_t>(kv.page_size) * kv.num_kv_heads * kv.k_head_dim;
      const size_t elems = page_elems * b * pages_per_seq;
      std::vector<HugeBuffer> kpool, vpool;  // as the engine's KV pool allocates them
      auto fill = [&](HugeBuffer& buf) {
        if (kv_dtype == DType::kF32) return std::fill(buf.data(), buf.data() + elems, 0.01f);
        auto* h = reinterpret_cast<uint16_t*>(buf.data());
        std::fill(h, h + elems, f32_to_bf16(0.01f));
      };
      for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
        kpool.emplace_back((elems * dtype_size(kv_dtype) + 3) / 4);
        vpool.emplace_back((elems * dtype_size(kv_dtype) + 3) / 4);
        fill(kpool.back());
        fill(vpool.back());
        kv.k_pages.push_back(kpool.back().data());
        kv.v_pages.push_back(vpool.back().data());
      }
      // Pages in shuffled order, as the engine's pool hands them out once requests have come
      // and gone (in order, the hardware prefetchers would follow a sequence across pages).
      std::vector<int32_t> order(static_cast<size_t>(b * pages_per_seq));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(42));
      model::Batch batch;
      for (int64_t s = 0; s < b; ++s) {
        const std::vector<int32_t> table(order.begin() + s * pages_per_seq, order.begin() + (s + 1) * pages_per_seq);
        batch.add_sequence({static_cast<int32_t>(100 + s)}, static_cast<int32_t>(ctx), table);
      }
      std::vector<float> logits(static_cast<size_t>(b * config.vocab_size));
      const double s = bench::best_seconds([&] { model.forward(batch, &kv, ws, logits.data()); }, t_min * 4, 5);
      ws.profile.reset();
      ws.profile.enabled = true;
      for (int r = 0; r < 5; ++r) model.forward(batch, &kv, ws, logits.data());
      ws.profile.enabled = false;
      const std::string breakdown = profile ? ws.profile.table() : std::string();
      const double gbs = weight_bytes / s / 1e9;
      std::printf("%5ld | %9.2f %9.1f | %10.1f %7.0f%%\n", static_cast<long>(b), s * 1e3, b / s, gbs,
                  100 * gbs / bw.copy_gbs);
      std::printf("%s", breakdown.c_str());
    }
  }
  std::printf("\nload average at the end: %s\n", bench::load_average().c_str());
  return 0;
}
