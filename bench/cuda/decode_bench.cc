// Decode on the CUDA backend: a ~110M-parameter Llama-style model with random weights (hidden
// 768, 12 layers, 12 heads, intermediate 2048, vocab 32000) in f32 and bf16, batches of 1, 8
// and 32 sequences with 128 tokens of context in device pages, single-token steps through
// model::Transformer::forward (logits copied back to the host each step, as the engine gets
// them). Next to it, the device's copy rate measured in this run (a device-to-device copy of
// 1 GiB, bytes read + written per second): batch-1 decode reads every weight once per step, so
// weight bytes per second over that rate is the share of memory bandwidth decode reaches.
// Reports numbers, never passes or fails. Run by scripts/gpu-check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/ops.h"
#include "infer/kv_storage.h"
#include "model/transformer.h"

using namespace astrai;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

model::ModelConfig bench_config() {
  Json j = {{"model_type", "llama"},     {"vocab_size", 32000},       {"hidden_size", 768},
            {"intermediate_size", 2048}, {"num_hidden_layers", 12},   {"num_attention_heads", 12},
            {"num_key_value_heads", 12}, {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},     {"tie_word_embeddings", false}};
  return model::ModelConfig::from_json(j, "cuda decode_bench config");
}

model::ModelWeights random_weights(const model::ModelConfig& config, DType dtype) {
  model::ModelWeights w = model::ModelWeights::allocate(config, dtype);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (auto& p : w.params(config)) {
    const int64_t n = shape_numel(p.shape);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& f : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / (1 << 23);
      f = p.shape.size() == 1 ? 1.0f : 0.035f * u;
    }
    convert_from_f32(v.data(), dtype, p.tensor->raw(), static_cast<size_t>(n));
  }
  return w;
}

// Bytes read + written per second by a device-to-device copy of `bytes` (best of 5).
double copy_rate(const backend::Ops& ops, size_t bytes) {
  void* a = ops.alloc(bytes);
  void* b = ops.alloc(bytes);
  ops.copy_bytes(b, a, bytes);  // warm
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    backend::cuda::synchronize();
    const auto t0 = Clock::now();
    ops.copy_bytes(b, a, bytes);
    backend::cuda::synchronize();
    best = std::min(best, seconds_since(t0));
  }
  ops.release(a);
  ops.release(b);
  return 2.0 * static_cast<double>(bytes) / best;
}

// Seconds per decode step for `batch` sequences after a 128-token prefill each.
double decode_step_seconds(const model::Transformer& m, const backend::Ops& ops, int32_t batch, int steps) {
  const int32_t prompt = 128, pages_per_seq = (prompt + steps + 16) / 16 + 1;
  const auto storage = infer::make_backend_kv_storage(
      ops, infer::kv_layout(m.kv_geometry(16, DType::kF32), m.config().num_hidden_layers), batch * pages_per_seq);
  const model::PagedKv& kv = storage->paged_kv();
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int32_t s = 0; s < batch; ++s)
    for (int32_t p = 0; p < pages_per_seq; ++p) tables[s].push_back(s * pages_per_seq + p);
  model::ForwardWorkspace ws;
  std::vector<float> logits(static_cast<size_t>(batch) * prompt * m.vocab_size());
  {
    model::Batch b;
    for (int32_t s = 0; s < batch; ++s) {
      std::vector<int32_t> ids(prompt);
      for (int32_t i = 0; i < prompt; ++i) ids[i] = (s * 131 + i * 7) % 32000;
      b.add_sequence(ids, 0, tables[s]);
      b.logit_rows.push_back(b.num_tokens() - 1);
    }
    m.forward(b, &kv, ws, logits.data());
  }
  double total = 0;
  for (int step = 0; step < steps + 2; ++step) {
    model::Batch b;
    for (int32_t s = 0; s < batch; ++s) b.add_sequence({(s + step * 17) % 32000}, prompt + step, tables[s]);
    const auto t0 = Clock::now();
    m.forward(b, &kv, ws, logits.data());  // returns once the logits are on the host
    if (step >= 2) total += seconds_since(t0);   // two warm-up steps
  }
  return total / steps;
}

}  // namespace

int main() {
  try {
    std::string why;
    if (!backend::cuda::available(&why)) {
      std::fprintf(stderr, "cuda decode_bench: %s\n", why.c_str());
      return 1;
    }
    const backend::Ops& ops = backend::ops_for(Device::kCuda);
    const double copy = copy_rate(ops, size_t(1) << 30);
    std::printf("device copy (1 GiB, read + write): %.0f GB/s\n", copy / 1e9);
    const model::ModelConfig config = bench_config();
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const model::Transformer m(config, random_weights(config, dtype), Device::kCuda);
      const double weight_bytes = static_cast<double>(m.weight_bytes());
      std::printf("model: %lld params, %s weights, %.0f MB\n", static_cast<long long>(m.num_parameters()),
                  std::string(dtype_name(dtype)).c_str(), weight_bytes / 1e6);
      for (int32_t batch : {1, 8, 32}) {
        const double s = decode_step_seconds(m, ops, batch, 32);
        std::printf("  batch %2d: %9.1f tok/s  step %7.3f ms  weights read at %6.0f GB/s (%4.1f%% of the copy rate)\n",
                    batch, batch / s, s * 1e3, weight_bytes / s / 1e9, 100.0 * weight_bytes / s / copy);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
