// Training throughput: our trainer vs PyTorch (Debian python3-torch) on the identical model
// (same initial weights) and the identical batches, in the same run, plus the BLAS SGEMM
// rate as the ceiling.
//   train_bench [small|100m] [steps] [threads] [seq]
// seq (default 128 small, 256 100m) sets the document length; the documents per update shrink
// so that the tokens per update stay the same (at least one document).
// Reports wall tokens/s and CPU seconds per update for both (CPU time is the fair measure on
// a shared machine), and achieved GFLOP/s (6·N·T for the matrices + 6·L·T·S·D attention).
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/json.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "bench_probes.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/params.h"
#include "train/strategy.h"

using namespace astrai;
using namespace astrai::train;

namespace {

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double sgemm_gflops(int m, int n, int k) {
  std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), b(static_cast<size_t>(n) * k, 0.25f),
      c(static_cast<size_t>(m) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  const int reps = 10;
  Timer t;
  for (int r = 0; r < reps; ++r)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  return 2.0 * m * n * k * reps / t.seconds() / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  astrai::kernels::reexec_for_blas_core(argv);
  const std::string preset = argc > 1 ? argv[1] : "small";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int64_t seq_arg = argc > 4 ? std::atoll(argv[4]) : 0;
  if (steps < 2 || threads < 1 || seq_arg < 0) {
    std::fprintf(stderr, "usage: train_bench [small|100m] [steps >= 2] [threads >= 1] [seq]\n");
    return 2;
  }
  set_num_threads(threads);
  Json cfg;
  int64_t batch = 16, seq = 128;
  if (preset == "100m") {
    cfg = {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 768}, {"intermediate_size", 2048},
           {"num_hidden_layers", 12}, {"num_attention_heads", 12}, {"num_key_value_heads", 12},
           {"tie_word_embeddings", true}, {"max_position_embeddings", 1024}};
    batch = 4;
    seq = 256;
  } else {
    cfg = {{"model_type", "llama"}, {"vocab_size", 4096}, {"hidden_size", 256}, {"intermediate_size", 688},
           {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
           {"tie_word_embeddings", true}, {"max_position_embeddings", 512}};
  }
  if (seq_arg > 0) {  // the same tokens per update in documents of seq_arg tokens
    batch = std::max<int64_t>(1, batch * seq / seq_arg);
    seq = seq_arg;
    cfg["max_position_embeddings"] = std::max<int64_t>(cfg["max_position_embeddings"].get<int64_t>(), seq + 1);
  }
  const model::ModelConfig arch = model::ModelConfig::from_json(cfg, preset);
  TrainModel model(arch);
  model.init_weights(1);
  const auto dir = std::filesystem::temp_directory_path() / ("astrai_train_bench_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& s : model.layout().specs())
    tensors.emplace_back(s.name, buffer_view(model.params(), s.offset, s.shape));
  astrai::model::write_safetensors((dir / "params.safetensors").string(), tensors);
  write_file_atomic((dir / "config.json").string(), cfg.dump());

  std::mt19937_64 rng(7);
  std::vector<std::vector<std::vector<int32_t>>> batches(static_cast<size_t>(steps));
  Json jb = Json::array();
  for (auto& b : batches) {
    Json rows = Json::array();
    for (int64_t i = 0; i < batch; ++i) {
      std::vector<int32_t> ids(static_cast<size_t>(seq + 1));
      for (auto& t : ids) t = static_cast<int32_t>(rng() % arch.vocab_size);
      b.push_back(ids);
      rows.push_back(ids);
    }
    jb.push_back(rows);
  }
  write_file_atomic((dir / "batches.json").string(), jb.dump());

  // Ours: one warmup update (allocations), then the timed ones.
  CrossEntropyStrategy ce("seq", 0.0f);
  AdamW adam(model.layout(), AdamWConfig{});
  auto update = [&](const std::vector<std::vector<int32_t>>& rows) {
    TrainBatch tb;
    for (const auto& r : rows) tb.add_document(r);
    model.zero_grads();
    const double loss = ce.run(model, tb, 1.0f).loss();
    clip_grad_norm(model.grads().data(), model.grads().size(), 1.0);
    adam.step(model.params().data(), model.grads().data(), 1e-4f);
    return loss;
  };
  update(batches[0]);
  Timer wall;
  const double cpu0 = cpu_seconds();
  double last = 0;
  for (int s = 1; s < steps; ++s) last = update(batches[static_cast<size_t>(s)]);
  const double ours_wall = wall.seconds(), ours_cpu = cpu_seconds() - cpu0;
  const int64_t tokens = batch * seq * (steps - 1);
  const double nonembed = static_cast<double>(model.num_params()) - static_cast<double>(arch.vocab_size * arch.hidden_size);
  const double flops = (6.0 * (nonembed + static_cast<double>(arch.vocab_size * arch.hidden_size)) +
                        6.0 * arch.num_hidden_layers * seq * arch.hidden_size) * static_cast<double>(tokens);

  const std::string py = std::string("OMP_NUM_THREADS=") + std::to_string(threads) + " /usr/bin/python3 " +
                         ASTRAI_SOURCE_DIR + "/bench/train_bench_torch.py " + dir.string() + " " +
                         std::to_string(threads) + " > " + (dir / "torch.json").string();
  const int rc = std::system(py.c_str());
  Json torch_res;
  if (rc == 0) torch_res = read_json_file((dir / "torch.json").string());
  const double gemm = sgemm_gflops(static_cast<int>(batch * seq), static_cast<int>(arch.intermediate_size),
                                   static_cast<int>(arch.hidden_size));

  std::printf("cpu: %s\n", bench::cpu_and_level().c_str());
  std::printf("model %s: %zu params, %lld x %lld tokens/update, %d timed updates, %d threads\n", preset.c_str(),
              model.num_params(), static_cast<long long>(batch), static_cast<long long>(seq), steps - 1, threads);
  std::printf("BLAS sgemm [%lld x %lld x %lld]: %.1f GFLOP/s\n", static_cast<long long>(batch * seq),
              static_cast<long long>(arch.intermediate_size), static_cast<long long>(arch.hidden_size), gemm);
  std::printf("astrai : %8.0f tok/s wall, %6.2f CPU-s/update, %6.1f GFLOP/s (per wall), loss %.4f\n",
              tokens / ours_wall, ours_cpu / (steps - 1), flops / ours_wall / 1e9, last);
  if (rc == 0) {
    const double tw = torch_res["wall_s"].get<double>(), tc = torch_res["cpu_s"].get<double>();
    std::printf("pytorch: %8.0f tok/s wall, %6.2f CPU-s/update, %6.1f GFLOP/s (per wall), loss %.4f\n", tokens / tw,
                tc / (steps - 1), flops / tw / 1e9, torch_res["last_loss"].get<double>());
    std::printf("speedup: %.2fx wall, %.2fx CPU time\n", tw / ours_wall, tc / ours_cpu);
  } else {
    std::printf("pytorch: failed (rc %d)\n", rc);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
