// The training loop behind `astrai train`: data → micro-batches → strategy (loss + backward)
// → all-reduce → clip → AdamW → schedule, with metrics, validation, checkpoints and exact
// resume.
//
// Step accounting: update N (1-based) uses learning_rate(schedule, N - 1); the checkpoint
// named step-N holds the weights after update N plus everything needed to run update N + 1
// exactly as an uninterrupted run would (AdamW moments and step count, sampler position).
//
// Data parallel (`mpirun -np N`, communicator.h): rank r trains on its share of each global
// batch (data::Sampler's rank sharding), gradients are weighted by each rank's share of the
// update's loss units and summed across ranks before clipping, so every rank applies the same
// update and N ranks of --batch-size b follow 1 rank of batch N·b. The sum runs per bucket (a
// layer's gradients), started during the last micro-batch's backward as each layer finishes
// (--no-overlap-allreduce: after it, the same buckets, so the same bits). With
// --shard-optimizer (ZeRO-1, train/shards.h) rank r keeps AdamW's moments only for its slice,
// clips and updates only that slice, and the ranks all-gather the weights: the same bits as
// without it. Only rank 0 writes (metrics,
// checkpoints, output, progress); a stop signal on any rank stops all after the same update.
//
// Output directory:
//   metrics.jsonl                    one record per update: step, loss, lr, grad_norm,
//                                    tokens_per_s, the strategy's metrics (dpo: rewards_*)
//                                    (under mpirun: comm_seconds, comm_exposed_seconds,
//                                    comm_bytes, optimizer_state_bytes)
//                                    (+ val_loss and val_<metric> when validated; grpo:
//                                    val_reward_mean); --val-at-start adds a step-0 record
//                                    with only the validation fields
//   checkpoints/step-00000042/       config.json, model.safetensors (HF layout, f32),
//                                    optimizer.safetensors (AdamW m, v), trainer_state.json,
//                                    tokenizer files; written under a temporary name, renamed
//   config.json, model.safetensors   the final weights (+ tokenizer files): `--model OUTPUT`
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "base/json.h"
#include "train/lora.h"

namespace astrai::train {

struct TrainOptions {
  std::string train_type = "seq";
  std::string data_dir;
  std::string model_dir;    // start from these weights, or
  std::string config_path;  // a fresh model from this config.json
  std::string tokenizer_dir;
  std::string output_dir;
  int64_t batch_size = 8;
  int64_t seq_len = 256;
  int64_t grad_accum = 1;
  double max_lr = 3e-4;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 100;
  std::string schedule = "cosine";
  int64_t epochs = 1;
  int64_t max_steps = 0;  // > 0 overrides epochs
  double max_grad_norm = 1.0;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double label_smoothing = 0.0;
  double dpo_beta = 0.1;
  std::string dpo_loss = "sigmoid";
  double dpo_label_smoothing = 0.0;
  // grpo
  int64_t group_size = 4;
  double clip_eps = 0.2;
  double kl_coef = 0.01;
  int64_t ref_sync_interval = 0;
  int64_t ppo_epochs = 1;
  std::string reward = "exact-match";
  double reward_timeout = 10.0;
  int64_t max_new_tokens = 64;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t ckpt_interval = 0;  // 0: only at the end (and on signals)
  double val_split = 0.0;
  int64_t val_interval = 0;   // 0: only at the end (when val_split > 0)
  int64_t val_batches = 16;   // micro-batches per validation
  bool val_at_start = false;  // also validate the starting weights (a step-0 record)
  uint64_t seed = 42;
  int threads = 0;
  bool resume = false;
  bool recompute = false;
  bool progress = true;
  double init_std = 0.02;
  LoraOptions lora;  // rank 0: full fine-tuning
  // Data parallel (mpirun -np N; communicator.h): --batch-size is per rank.
  bool deterministic_allreduce = false;  // rank-ordered sums: reruns give the same bits
  double collective_timeout = 600.0;     // seconds a collective may wait; <= 0: forever
  // ZeRO-1 (train/shards.h): each rank holds AdamW's moments of its slice of the parameters,
  // updates only that slice and the ranks all-gather the weights. One process: no effect.
  bool shard_optimizer = false;
  // The gradient all-reduce started layer by layer during the last micro-batch's backward.
  bool overlap_allreduce = true;
  // Where the model trains (--device): parameters, gradients, activations, the loss and
  // AdamW's moments in that device's memory. cuda: seq and sft, full fine-tuning, one process.
  Device device = Device::kCpu;
};

struct TrainResult {
  int64_t steps_done = 0;
  double last_loss = 0.0;
  double last_val_loss = -1.0;  // < 0 when never validated
  bool interrupted = false;     // stopped by SIGINT/SIGTERM (checkpoint saved)
  std::string last_checkpoint;
  bool primary = true;  // rank 0 (the one that writes), or a single process
};

// Runs training; throws astrai::Error for bad inputs (before training starts) and for a
// non-finite loss (training stops; the last good checkpoint is left intact).
TrainResult run_training(const TrainOptions& options);

// Set by the SIGINT/SIGTERM handler run_training installs; checked between updates.
extern std::atomic<int> g_stop_signal;

}  // namespace astrai::train
