// Decode on the CUDA backend: a ~134M-parameter Llama-style model with random weights (hidden
// 768, 12 layers, 12 heads, intermediate 2048, vocab 32000) in f32 and bf16, batches of 1, 8
// and 32 sequences with 128 tokens of context in device pages, and of 1 and 8 with 4096; then
// a ~1.1B one in bf16 (TinyLlama's shape) at batches 1, 8 and 32 with 128,
// single-token steps through model::Transformer::forward (logits copied back to the host each
// step, as the engine gets them), run op by op and replayed as CUDA graphs. Beside each step's
// wall time: the host's time issuing it and the device's time running it (first operation to
// last, CUDA events; cuda::StepTiming). Next to it, the device's copy rate measured in this run (a device-to-device copy of
// 1 GiB, bytes read + written per second): batch-1 decode reads every weight once per step, so
// weight bytes per second over that rate is the share of memory bandwidth decode reaches.
// Reports numbers, never passes or fails. Run by scripts/gpu-check.sh.
#include <algorithm>
#include <chrono>
#include <cstdlib>
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

// The small model (hidden 768, 12 layers: launch latency bounds it on a large GPU) or a
// ~1.1B one (hidden 2048, 22 layers, 32 heads / 4 KV heads, intermediate 5632: TinyLlama's
// shape, where reading the weights dominates).
model::ModelConfig bench_config(bool large) {
  Json j = {{"model_type", "llama"},     {"vocab_size", 32000},       {"hidden_size", 768},
            {"intermediate_size", 2048}, {"num_hidden_layers", 12},   {"num_attention_heads", 12},
            {"num_key_value_heads", 12}, {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},     {"tie_word_embeddings", false}};
  if (large) {
    j["hidden_size"] = 2048;
    j["intermediate_size"] = 5632;
    j["num_hidden_layers"] = 22;
    j["num_attention_heads"] = 32;
    j["num_key_value_heads"] = 4;
  }
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

// Per decode step: wall seconds (forward call to logits on the host), and of the backend's
// cached step inside it, the host's issuing time and the device's time (cuda::StepTiming).
struct StepTime {
  double wall = 0, host = 0, device = 0;
};
struct StepTimes {
  StepTime op_by_op, graphs;
};

// Seconds per decode step for `batch` sequences after a `prompt`-token prefill each: `steps`
// steps run op by op, then `steps` replayed as CUDA graphs (two warm-up steps before each
// timed run: a graph is captured on a key's second step).
StepTimes decode_step_seconds(const model::Transformer& m, const backend::Ops& ops, int32_t batch, int32_t prompt,
                              int steps, const std::string& modes) {
  const int32_t pages_per_seq = (prompt + 2 * (steps + 2) + 16) / 16 + 1;
  const auto storage = infer::make_backend_kv_storage(
      ops, infer::kv_layout(m.kv_geometry(16, DType::kF32), m.config().num_hidden_layers), batch * pages_per_seq);
  const model::PagedKv& kv = storage->paged_kv();
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int32_t s = 0; s < batch; ++s)
    for (int32_t p = 0; p < pages_per_seq; ++p) tables[s].push_back(s * pages_per_seq + p);
  model::ForwardWorkspace ws;
  std::vector<float> logits(static_cast<size_t>(batch) * m.vocab_size());
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
  int32_t position = prompt;
  auto run = [&](bool graphs) {
    backend::cuda::set_graphs(graphs);
    double total = 0;
    for (int step = 0; step < steps + 2; ++step, ++position) {
      if (step == 2) backend::cuda::take_step_timing();  // drop the warm-up steps'
      model::Batch b;
      for (int32_t s = 0; s < batch; ++s) b.add_sequence({(s + position * 17) % 32000}, position, tables[s]);
      const auto t0 = Clock::now();
      m.forward(b, &kv, ws, logits.data());  // returns once the logits are on the host
      if (step >= 2) total += seconds_since(t0);
    }
    const backend::cuda::StepTiming timing = backend::cuda::take_step_timing();
    const double n = timing.steps > 0 ? static_cast<double>(timing.steps) : 1.0;
    return StepTime{total / steps, timing.host_seconds / n, timing.device_seconds / n};
  };
  StepTimes t;
  if (modes != "graphs") t.op_by_op = run(false);
  if (modes != "ops") t.graphs = run(true);
  return t;
}

}  // namespace

// cuda_decode_bench                          every configuration, op by op and as graphs
// cuda_decode_bench f32|bf16 BATCH CONTEXT [ops|graphs]
//                                            one configuration (for a profiler such as ncu)
// ASTRAI_BENCH_STEPS: timed decode steps per run (default 32); ASTRAI_BENCH_LARGE=1: the one
// configuration is of the ~1.1B model.
int main(int argc, char** argv) {
  try {
    std::vector<DType> dtypes = {DType::kF32, DType::kBF16};
    std::vector<std::pair<int32_t, int32_t>> shapes = {{1, 128}, {8, 128}, {32, 128}, {1, 4096}, {8, 4096}};
    std::string modes = "both";
    const char* steps_env = std::getenv("ASTRAI_BENCH_STEPS");  // timed steps per run (default 32)
    const int steps = steps_env ? std::max(1, std::atoi(steps_env)) : 32;
    if (argc == 4 || argc == 5) {
      dtypes = {std::string(argv[1]) == "bf16" ? DType::kBF16 : DType::kF32};
      shapes = {{std::atoi(argv[2]), std::atoi(argv[3])}};
      if (argc == 5) modes = argv[4];
    } else if (argc != 1) {
      std::fprintf(stderr, "usage: cuda_decode_bench [f32|bf16 BATCH CONTEXT [ops|graphs]]\n");
      return 2;
    }
    std::string why;
    if (!backend::cuda::available(&why)) {
      std::fprintf(stderr, "cuda decode_bench: %s\n", why.c_str());
      return 1;
    }
    const backend::Ops& ops = backend::ops_for(Device::kCuda);
    const double copy = copy_rate(ops, size_t(1) << 30);
    std::printf("device copy (1 GiB, read + write): %.0f GB/s\n", copy / 1e9);
    struct Run {
      bool large;
      DType dtype;
      std::vector<std::pair<int32_t, int32_t>> shapes;
    };
    std::vector<Run> runs;
    const char* large_env = std::getenv("ASTRAI_BENCH_LARGE");  // one configuration, of the ~1.1B model
    const bool large_only = large_env != nullptr && std::string(large_env) == "1" && argc > 1;
    for (DType dtype : dtypes) runs.push_back({large_only, dtype, shapes});
    if (argc == 1) runs.push_back({true, DType::kBF16, {{1, 128}, {8, 128}, {32, 128}}});
    for (const Run& r : runs) {
      const model::ModelConfig config = bench_config(r.large);
      const DType dtype = r.dtype;
      const model::Transformer m(config, random_weights(config, dtype), Device::kCuda);
      const double weight_bytes = static_cast<double>(m.weight_bytes());
      std::printf("model: %lld params, %s weights, %.0f MB\n", static_cast<long long>(m.num_parameters()),
                  std::string(dtype_name(dtype)).c_str(), weight_bytes / 1e6);
      for (auto [batch, prompt] : r.shapes) {
        const StepTimes t = decode_step_seconds(m, ops, batch, prompt, steps, modes);
        for (auto [name, st] : {std::pair<const char*, StepTime>{"op by op", t.op_by_op}, {"graphs  ", t.graphs}}) {
          const double s = st.wall;
          if (s <= 0) continue;
          std::printf("  batch %2d, context %4d, %s: %9.1f tok/s  step %6.3f ms (host %6.3f, device %6.3f)  weights "
                      "read at %5.0f GB/s (%4.1f%% of the copy rate)\n",
                      batch, prompt, name, batch / s, s * 1e3, st.host * 1e3, st.device * 1e3, weight_bytes / s / 1e9,
                      100.0 * weight_bytes / s / copy);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
