// `astrai train`: pretraining (seq), supervised fine-tuning (sft), preference tuning (dpo) and
// online reinforcement learning (grpo) on preprocessed shards.
#include <cstdio>
#include <memory>

#include "base/log.h"
#include "cli/command.h"
#include "dashboard/dashboard_server.h"
#include "dashboard/stop_signal.h"
#include "kernels/cpu/gemm_mode.h"
#include "train/communicator.h"
#include "train/trainer.h"

namespace astrai::cli {
namespace {

struct DashboardFlags {
  bool on = false;
  dashboard::DashboardOptions options;
};

// Trains; with --dashboard also serves the run's live plots, from before the first update
// until Ctrl-C / SIGTERM after a finished run (an interrupted run exits at once).
void run_train(const train::TrainOptions& opts, const DashboardFlags& dash) {
  // The bf16-dot mode rounds the activations in the forward only; a frozen bf16 base (LoRA)
  // and grpo's rollouts are computed exactly, as the backward and the PyTorch checks assume.
  if (kernels::bf16_dot()) {
    log_info("train: --bf16-dot (ASTRAI_BF16_DOT) is an inference mode; training widens bf16 weights exactly");
    kernels::set_bf16_dot(false);
  }
  std::unique_ptr<dashboard::DashboardServer> server;
  // One dashboard per run: under mpirun every rank would open one (run `astrai dashboard
  // OUTPUT` beside the job instead).
  ASTRAI_CHECK(!dash.on || train::launched_world_size() <= 1,
               "--dashboard under mpirun/srun is not supported: run `astrai dashboard ", opts.output_dir,
               "` beside the job");
  if (dash.on) {
    server = std::make_unique<dashboard::DashboardServer>(std::vector<std::string>{opts.output_dir}, dash.options);
    server->start();
    log_info("dashboard: listening on ", server->url());
  }
  const train::TrainResult r = train::run_training(opts);
  if (!r.primary) return;  // data parallel: rank 0 reports
  std::printf("%s after %lld updates: loss %.4f%s%s\n", r.interrupted ? "stopped" : "done",
              static_cast<long long>(r.steps_done), r.last_loss,
              r.last_val_loss >= 0 ? (", val_loss " + std::to_string(r.last_val_loss)).c_str() : "",
              r.last_checkpoint.empty() ? "" : (", checkpoint " + r.last_checkpoint).c_str());
  std::fflush(stdout);
  if (server && !r.interrupted) {
    // The trainer's SIGINT/SIGTERM handlers are gone with the run; from here they end the wait.
    dashboard::StopSignal stop;
    log_info("dashboard: training finished; still serving ", server->url(), " (Ctrl-C to exit)");
    stop.wait();
  }
  if (server) server->stop();
}

void setup_train(CLI::App& app) {
  auto opts = std::make_shared<train::TrainOptions>();
  auto dash = std::make_shared<DashboardFlags>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model (seq: pretraining, sft: masked fine-tuning, dpo: preference pairs, grpo: online RL)");
  // A later occurrence of an option overrides an earlier one (scripts append overrides).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--train-type", opts->train_type,
                  "seq (next-token loss on every token) | sft (on response tokens) | dpo (preference pairs, "
                  "against the starting weights as the reference policy) | grpo (prompts: completions generated "
                  "by our engine on the live weights, scored by --reward)")
      ->check(CLI::IsMember({"seq", "sft", "dpo", "grpo"}))
      ->capture_default_str();
  cmd->add_option("--data", opts->data_dir, "preprocessed dataset directory (astrai preprocess)")->required();
  cmd->add_option("--model", opts->model_dir, "start from this HF checkpoint directory");
  cmd->add_option("--config", opts->config_path, "or a fresh model from this config.json");
  cmd->add_option("--tokenizer", opts->tokenizer_dir, "tokenizer directory (vocabulary checked, copied to the output)");
  cmd->add_option("--output", opts->output_dir, "output directory (metrics, checkpoints, final weights)")->required();
  cmd->add_option("--batch-size", opts->batch_size,
                  "sequences (dpo: pairs, grpo: prompts) per micro-batch (per rank under mpirun)")->capture_default_str();
  cmd->add_option("--seq-len", opts->seq_len, "tokens per sequence (dpo: per side of a pair, longer sides are cut; grpo: unused)")
      ->capture_default_str();
  cmd->add_option("--grad-accum", opts->grad_accum, "micro-batches per update")->capture_default_str();
  cmd->add_option("--max-lr", opts->max_lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr-ratio", opts->min_lr_ratio, "final rate / peak rate")->capture_default_str();
  cmd->add_option("--warmup-steps", opts->warmup_steps, "linear warmup updates")->capture_default_str();
  cmd->add_option("--schedule", opts->schedule, "cosine | sgdr | wsd")
      ->check(CLI::IsMember({"cosine", "sgdr", "wsd"}))
      ->capture_default_str();
  cmd->add_option("--epochs", opts->epochs, "passes over the training set")->capture_default_str();
  cmd->add_option("--max-steps", opts->max_steps, "number of updates (overrides --epochs)");
  cmd->add_option("--max-grad-norm", opts->max_grad_norm, "global gradient-norm clip (0 = off)")->capture_default_str();
  cmd->add_option("--weight-decay", opts->weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cmd->add_option("--label-smoothing", opts->label_smoothing, "cross-entropy label smoothing (seq, sft)")
      ->capture_default_str();
  cmd->add_option("--dpo-beta", opts->dpo_beta, "dpo: strength of the pull towards the reference policy (β)")
      ->capture_default_str();
  cmd->add_option("--dpo-loss", opts->dpo_loss,
                  "dpo: sigmoid (DPO) | ipo (squared loss on mean log-probabilities per token)")
      ->check(CLI::IsMember({"sigmoid", "ipo"}))
      ->capture_default_str();
  cmd->add_option("--dpo-label-smoothing", opts->dpo_label_smoothing,
                  "dpo, sigmoid loss: assumed chance that a pair's labels are swapped (conservative DPO), in [0, 0.5)")
      ->capture_default_str();
  cmd->add_option("--group-size", opts->group_size, "grpo: completions per prompt (advantages are normalised per group)")
      ->capture_default_str();
  cmd->add_option("--reward", opts->reward,
                  "grpo: exact-match (last word of the completion == the prompt's \"answer\") | regex:PATTERN "
                  "(1 when it matches the completion) | command:PROGRAM (JSON {prompt, completion, answer} on "
                  "stdin, a number on stdout)")
      ->capture_default_str();
  cmd->add_option("--reward-timeout", opts->reward_timeout, "grpo: seconds a reward command may take")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", opts->max_new_tokens, "grpo: tokens a completion may have")->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "grpo: sampling temperature of rollouts")->capture_default_str();
  cmd->add_option("--top-p", opts->top_p, "grpo: nucleus sampling of rollouts")->capture_default_str();
  cmd->add_option("--clip-eps", opts->clip_eps, "grpo: the policy ratio is clipped to [1 - eps, 1 + eps]")
      ->capture_default_str();
  cmd->add_option("--kl-coef", opts->kl_coef, "grpo: weight of the KL penalty to the reference policy (k3 estimator)")
      ->capture_default_str();
  cmd->add_option("--ref-sync-interval", opts->ref_sync_interval,
                  "grpo: copy the policy into the reference every N updates (0 = the reference stays the start)")
      ->capture_default_str();
  cmd->add_option("--ppo-epochs", opts->ppo_epochs, "grpo: updates per batch of rollouts")->capture_default_str();
  cmd->add_option("--lora-rank", opts->lora.rank,
                  "train LoRA adapters of this rank instead of every weight (0 = full fine-tuning); the output "
                  "is an adapter directory (PEFT layout) for --lora / astrai lora merge")
      ->capture_default_str();
  cmd->add_option("--lora-alpha", opts->lora.alpha, "LoRA scale numerator: the adapter adds (alpha / rank)·B·A")
      ->capture_default_str();
  auto targets = std::make_shared<std::string>("q,k,v,o,gate,up,down");
  cmd->add_option("--lora-targets", *targets, "projections that get adapters: any of q,k,v,o,gate,up,down")
      ->capture_default_str()
      ->each([opts](const std::string& v) { opts->lora.targets = train::parse_lora_targets(v); });
  cmd->add_option("--lora-dropout", opts->lora.dropout,
                  "dropout on each adapter's input in training forwards, in [0, 1) (none in validation)")
      ->capture_default_str();
  cmd->add_option("--ckpt-interval", opts->ckpt_interval, "checkpoint every N updates (0 = at the end)");
  cmd->add_option("--val-split", opts->val_split,
                  "fraction of samples held out for validation (grpo: prompts, validated by their mean reward)");
  cmd->add_option("--val-interval", opts->val_interval, "validate every N updates (0 = at the end)");
  cmd->add_option("--val-batches", opts->val_batches, "micro-batches per validation")->capture_default_str();
  cmd->add_flag("--val-at-start", opts->val_at_start,
                "also validate the starting weights (a metrics record for step 0 with only val_ fields)");
  cmd->add_option("--seed", opts->seed, "seed of init, split and sampling")->capture_default_str();
  cmd->add_option("--threads", opts->threads,
                  "threads (0 = all cores; under mpirun, cores / ranks on the machine unless OMP_NUM_THREADS is set)");
  cmd->add_flag("--resume", opts->resume, "continue from the latest checkpoint in --output");
  cmd->add_flag("--recompute", opts->recompute, "recompute activations in the backward (less memory)");
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device,
                  "where the model trains: cpu, or cuda (the first NVIDIA GPU; a build with the CUDA backend, "
                  "libastrai_cuda.so beside the binary; seq and sft, every parameter, one process)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("!--no-progress", opts->progress, "no progress bar");
  cmd->add_flag("--deterministic-allreduce", opts->deterministic_allreduce,
                "data parallel (mpirun -np N): sum gradients in rank order (gather to rank 0, sum, broadcast) "
                "instead of the MPI library's reduction, so that reruns with the same N give the same bits");
  cmd->add_flag("--shard-optimizer", opts->shard_optimizer,
                "data parallel: ZeRO-1, each rank keeps the AdamW moments of 1/N of the parameters, updates that "
                "slice and the ranks all-gather the weights (the same bits as without; no effect in one process)");
  cmd->add_flag("!--no-overlap-allreduce", opts->overlap_allreduce,
                "data parallel: sum the gradients after the backward instead of layer by layer during the last "
                "micro-batch's backward (the same bits)");
  cmd->add_option("--collective-timeout", opts->collective_timeout,
                  "data parallel: seconds a rank waits in a collective (for a rank that died or stalls; also "
                  "covers rank 0 writing a checkpoint) before the job is aborted; 0 = wait forever")
      ->capture_default_str();
  cmd->add_flag("--dashboard", dash->on,
                "serve live plots of this run's metrics (astrai dashboard) while it trains, and once it finished "
                "until Ctrl-C (a run stopped by a signal exits at once)");
  cmd->add_option("--host", dash->options.host, "--dashboard: address to listen on")->capture_default_str();
  cmd->add_option("--port", dash->options.port, "--dashboard: port (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->callback([opts, dash, device]() {
    opts->device = *device == "cuda" ? Device::kCuda : Device::kCpu;
    run_train(*opts, *dash);
  });
}

const bool kRegistered = register_command(&setup_train);

}  // namespace
}  // namespace astrai::cli
