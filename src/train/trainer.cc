#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "base/files.h"
#include "base/gguf_file.h"
#include "base/log.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "data/sampler.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "train/batch_source.h"
#include "train/communicator.h"
#include "train/live_model.h"
#include "train/lora.h"
#include "train/rollout.h"
#include "train/optimizer.h"
#include "train/params.h"
#include "train/schedule.h"
#include "train/shards.h"
#include "train/strategy.h"

namespace astrai::train {

std::atomic<int> g_stop_signal{0};

namespace fs = std::filesystem;

namespace {

void on_signal(int sig) { g_stop_signal.store(sig); }

// Installs the stop handlers for the lifetime of a training run.
class SignalGuard {
 public:
  SignalGuard() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The dropout seed of micro-batch m of update `step` (a resumed run draws the same masks).
uint64_t dropout_seed(uint64_t seed, int64_t step, int64_t micro) {
  return backend::splitmix64(backend::splitmix64(seed) + static_cast<uint64_t>(step) * 4096 + static_cast<uint64_t>(micro));
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// The checkpoint with the highest step under OUTPUT/checkpoints (empty when none).
std::string latest_checkpoint(const std::string& output) {
  const fs::path root = fs::path(output) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  std::string best;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "trainer_state.json")) continue;
    if (name > best) best = name;
  }
  return best.empty() ? std::string() : (root / best).string();
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

// "dpo_beta" -> "dpo-beta": the command-line spelling of an option's JSON key.
std::string flag_name(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

std::string fixed(const Json& value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value.get<double>());
  return buf;
}

Json options_fingerprint(const TrainOptions& o, int world_size) {
  // What must not change across a resume for it to continue the same run. "batch_size" is
  // the global batch (--batch-size × ranks): a resume may change the number of ranks.
  Json j{{"train_type", o.train_type}, {"batch_size", o.batch_size * world_size}, {"seq_len", o.seq_len},
         {"grad_accum", o.grad_accum}, {"seed", o.seed}, {"val_split", o.val_split}};
  if (o.train_type == "dpo") {
    j["dpo_beta"] = o.dpo_beta;
    j["dpo_loss"] = o.dpo_loss;
    j["dpo_label_smoothing"] = o.dpo_label_smoothing;
  }
  if (o.lora.rank > 0) {
    std::string targets;
    for (const auto& t : o.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    j["lora_rank"] = o.lora.rank;
    j["lora_alpha"] = o.lora.alpha;
    j["lora_dropout"] = o.lora.dropout;
    j["lora_targets"] = targets;
  }
  if (o.train_type == "grpo") {
    for (auto [k, v] : {std::pair<const char*, Json>{"group_size", o.group_size}, {"clip_eps", o.clip_eps},
                        {"kl_coef", o.kl_coef}, {"ref_sync_interval", o.ref_sync_interval},
                        {"ppo_epochs", o.ppo_epochs}, {"reward", o.reward}, {"max_new_tokens", o.max_new_tokens},
                        {"temperature", o.temperature}, {"top_p", o.top_p}})
      j[k] = v;
  }
  return j;
}

// The layer a parameter belongs to ("...layers.12.self_attn..." -> 12), or -1 for none.
int64_t layer_of(const std::string& name) {
  const size_t p = name.find("layers.");
  if (p == std::string::npos) return -1;
  size_t i = p + 7, j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

// A bucket of the gradient all-reduce: floats [begin, end) of the buffer, complete when the
// backward reports `event` (TrainModel::set_grad_hook: a layer, `layers` for the LM head and
// final norm, -1 for the embedding). The buckets tile the buffer.
struct Bucket {
  size_t begin, end;
  int64_t event;
};

std::vector<Bucket> grad_buckets(const std::vector<ParamSpec>& specs, size_t total, int64_t layers) {
  std::vector<Bucket> out;
  bool seen_layer = false;
  for (const ParamSpec& s : specs) {
    int64_t e = layer_of(s.name);
    if (e >= 0) seen_layer = true;
    else e = seen_layer ? layers : -1;  // before the layers: the embedding; after: head and final norm
    if (out.empty() || out.back().event != e) {
      if (!out.empty()) out.back().end = s.offset;
      out.push_back({out.empty() ? 0 : s.offset, total, e});
    }
  }
  return out;
}

class Run {
 public:
  Run(const TrainOptions& o, Communicator& comm) : o_(o), comm_(comm) {}
  TrainResult go();

 private:
  void setup_model();
  void setup_data();
  MicroStats validate();
  // {"step", val_loss or the source's val_* fields}.
  Json validation_record();
  int64_t val_count() const {
    return std::min<int64_t>(static_cast<int64_t>(val_pool_.size()), o_.val_batches * o_.batch_size * comm_.size());
  }
  bool primary() const { return comm_.rank() == 0; }  // the rank that writes
  // ZeRO-1 in effect (--shard-optimizer with more than one rank), and this rank's shard index
  // in shards_ (0: the one shard of an unsharded run).
  bool sharded() const { return o_.shard_optimizer && comm_.size() > 1; }
  int shard() const { return sharded() ? comm_.rank() : 0; }
  // The update's micro-batches (forward, loss, backward) and the gradient all-reduce, per
  // bucket, started during the last backward (--no-overlap-allreduce: after it); returns when
  // every bucket is summed, with the seconds spent waiting for that after the backward.
  void run_micro_batches(std::vector<TrainBatch>& batches, const std::vector<double>& units, double* loss,
                         int64_t* tokens, MicroStats* stats, double* exposed_s);
  // Data parallel: per micro-batch, the loss units of all ranks (Strategy::count_units).
  std::vector<double> global_units(const std::vector<TrainBatch>& batches);
  // Sums s and `extra` over the ranks in one all-reduce.
  void all_reduce_stats(MicroStats* s, std::vector<double>* extra);
  // Whether a stop signal reached any rank (every rank calls this after every update).
  bool stop_agreed();
  // Adds a micro-batch's (or validation's) metrics to a metrics.jsonl record.
  void add_metrics(const MicroStats& s, const std::string& prefix, Json* rec) const;
  // One progress line for the update in `rec` (redrawn in place on a terminal).
  void print_progress(const Json& rec, double seconds_per_step, int64_t first_step) const;
  void save_weights(const std::string& dir) const;
  void save_checkpoint(int64_t step);
  void load_checkpoint(const std::string& dir);
  void write_metrics_line(const Json& j);

  const TrainOptions& o_;
  model::ModelConfig config_;
  std::unique_ptr<TrainModel> model_;
  std::unique_ptr<AdamW> adam_;          // over the model's parameters, or the LoRA factors
  std::unique_ptr<ShardPlan> shards_;    // over the same buffer: comm_.size() shards with --shard-optimizer, else 1
  std::vector<Bucket> buckets_;          // of the gradient all-reduce
  std::unique_ptr<LoraAdapters> lora_;   // --lora-rank > 0
  std::unique_ptr<Strategy> strategy_;
  std::vector<Strategy::Metric> metrics_;  // strategy_->metrics()
  const bool tty_ = ::isatty(2) != 0;      // progress redrawn in place
  Communicator& comm_;
  std::unique_ptr<BatchSource> source_;
  std::unique_ptr<data::Sampler> sampler_;
  std::vector<int64_t> val_pool_;
  ScheduleConfig sched_;
  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  std::string last_ckpt_;
  std::string tokenizer_dir_;  // --tokenizer, or the --model directory when it holds one
};

void Run::setup_model() {
  ASTRAI_CHECK(o_.model_dir.empty() != o_.config_path.empty(), "give exactly one of --model DIR or --config FILE");
  ASTRAI_CHECK(!is_gguf_file(o_.model_dir), o_.model_dir,
               ": training reads safetensors checkpoints; a GGUF file serves inference only");
  if (!o_.model_dir.empty()) config_ = model::ModelConfig::load(o_.model_dir);
  else config_ = model::ModelConfig::from_json(read_json_file(o_.config_path), o_.config_path);
  ASTRAI_CHECK(config_.weight_format.empty(), o_.model_dir.empty() ? o_.config_path : o_.model_dir, ": ",
               config_.weight_format, " weights cannot be trained; train the float checkpoint it was quantized from");
  // LoRA: a frozen base read where it lies (an f32 checkpoint stays memory-mapped) and
  // adapters in the layers; otherwise every parameter is trained.
  const bool lora = o_.lora.rank > 0;
  if (o_.device != Device::kCpu) {
    const std::string on = str_cat("--device ", device_name(o_.device));
    ASTRAI_CHECK(o_.train_type == "seq" || o_.train_type == "sft", on,
                 " trains seq and sft only; dpo and grpo run on the CPU (--device cpu)");
    ASTRAI_CHECK(!lora, on, " trains every parameter; LoRA (--lora-rank) runs on the CPU (--device cpu)");
    ASTRAI_CHECK(comm_.size() == 1, on, " trains in one process; data parallel runs (mpirun) are for the CPU");
  }
  model_ = std::make_unique<TrainModel>(config_, o_.recompute, /*trainable=*/!lora, o_.device);
  if (!o_.model_dir.empty()) {
    auto contents = model::read_checkpoint_tensors(o_.model_dir);
    if (lora) model_->view_weights(contents.tensors, o_.model_dir);
    else model_->load_weights(contents.tensors, o_.model_dir);
  } else {
    model_->init_weights(o_.seed, static_cast<float>(o_.init_std));
  }
  // The tokenizer: --tokenizer, else the one a --model directory holds (fine-tuning keeps it).
  tokenizer_dir_ = o_.tokenizer_dir;
  if (tokenizer_dir_.empty() && !o_.model_dir.empty() && file_exists(o_.model_dir + "/tokenizer.json"))
    tokenizer_dir_ = o_.model_dir;
  if (!tokenizer_dir_.empty()) {
    const auto tok = tokenizer::Tokenizer::load(tokenizer_dir_);
    ASTRAI_CHECK(static_cast<int64_t>(tok.vocab_size()) <= config_.vocab_size, "the tokenizer at ", tokenizer_dir_,
                 " has ", tok.vocab_size(), " tokens but the model's vocab_size is ", config_.vocab_size,
                 ": tokenizer and model do not match");
  }
  AdamWConfig ac;
  ac.beta1 = static_cast<float>(o_.beta1);
  ac.beta2 = static_cast<float>(o_.beta2);
  ac.eps = static_cast<float>(o_.adam_eps);
  ac.weight_decay = static_cast<float>(o_.weight_decay);
  if (lora) {
    lora_ = std::make_unique<LoraAdapters>(*model_, o_.lora, o_.seed);
    lora_->refresh();  // B = 0: the base model's forward, bit for bit
    model_->set_adapters(lora_->layer_adapters(), o_.lora.rank);
  }
  const std::vector<ParamSpec>& specs = lora ? lora_->specs() : model_->layout().specs();
  const size_t total = lora ? lora_->num_params() : model_->layout().total();
  shards_ = std::make_unique<ShardPlan>(specs, total, sharded() ? comm_.size() : 1);
  adam_ = std::make_unique<AdamW>(specs, total, shards_->begin(shard()), shards_->end(shard()), ac, model_->ops());
  buckets_ = grad_buckets(specs, total, config_.num_hidden_layers);
  StrategyOptions so;
  so.train_type = o_.train_type;
  so.label_smoothing = static_cast<float>(o_.label_smoothing);
  so.dpo_beta = static_cast<float>(o_.dpo_beta);
  so.dpo_loss = o_.dpo_loss;
  so.dpo_label_smoothing = static_cast<float>(o_.dpo_label_smoothing);
  so.clip_eps = static_cast<float>(o_.clip_eps);
  so.kl_coef = static_cast<float>(o_.kl_coef);
  so.ref_sync_interval = o_.ref_sync_interval;
  // DPO's reference policy: the starting weights (--model, or the seeded init of --config,
  // which a resume rebuilds identically before loading the checkpoint).
  strategy_ = make_strategy(so, *model_);
  metrics_ = strategy_->metrics();
}

void Run::setup_data() {
  if (o_.train_type == "grpo") {
    auto shards = data::Shards::open(o_.data_dir);
    shards.check_vocab(model_->config().vocab_size);
    RolloutOptions ro;
    ro.group_size = static_cast<int32_t>(o_.group_size);
    ro.max_new_tokens = static_cast<int32_t>(o_.max_new_tokens);
    ro.temperature = static_cast<float>(o_.temperature);
    ro.top_p = static_cast<float>(o_.top_p);
    ro.seed = o_.seed;
    ro.reward = o_.reward;
    ro.reward_timeout = o_.reward_timeout;
    ro.behaviour_logp = o_.ppo_epochs > 1;
    // The engine generates with the live weights (views: every update is seen), merged with
    // the adapters under LoRA.
    auto weights = lora_ ? lora_->merged_weights() : model_->weights();
    source_ = std::make_unique<RolloutSource>(std::move(shards), *model_, std::move(weights), tokenizer_dir_, ro);
  } else {
    source_ = open_batch_source(o_.train_type, o_.data_dir, o_.seq_len, model_->config().vocab_size);
  }
  const int64_t n = source_->size();
  std::vector<int64_t> train_pool;
  if (o_.val_split > 0) {
    auto split = data::split_train_val(n, o_.val_split, o_.seed);
    train_pool = std::move(split.train);
    val_pool_ = std::move(split.val);
  } else {
    train_pool.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) train_pool[i] = i;
  }
  data::SamplerOptions so;
  so.seed = o_.seed;
  so.rank = comm_.rank();
  so.world_size = comm_.size();
  sampler_ = std::make_unique<data::Sampler>(std::move(train_pool), so);
  const int64_t per_step = o_.batch_size * o_.grad_accum;
  // With --ppo-epochs k, each batch of rollouts is trained on for k updates.
  const int64_t steps_per_epoch = std::max<int64_t>(1, sampler_->per_rank() / per_step) * o_.ppo_epochs;
  total_steps_ = o_.max_steps > 0 ? o_.max_steps : o_.epochs * steps_per_epoch;
  ASTRAI_CHECK(total_steps_ % o_.ppo_epochs == 0 && o_.ckpt_interval % o_.ppo_epochs == 0,
               "--max-steps and --ckpt-interval must be multiples of --ppo-epochs ", o_.ppo_epochs,
               " (checkpoints fall between batches of rollouts)");
  ASTRAI_CHECK(total_steps_ > 0, "nothing to train: --epochs and --max-steps give 0 steps");
}

MicroStats Run::validate() {
  MicroStats total;
  if (val_pool_.empty()) return total;
  const EvalMode eval(*model_);
  TrainBatch b;
  const int64_t n = val_count();
  // Rank r evaluates micro-batches r, r + ranks, ...; the sums are added across ranks.
  for (int64_t i = comm_.rank() * o_.batch_size; i < n; i += o_.batch_size * comm_.size()) {
    std::vector<int64_t> idx(val_pool_.begin() + i, val_pool_.begin() + std::min(n, i + o_.batch_size));
    source_->fill(idx, &b);
    total.add(strategy_->evaluate(*model_, b));
  }
  std::vector<double> none;
  all_reduce_stats(&total, &none);
  return total;
}

std::vector<double> Run::global_units(const std::vector<TrainBatch>& batches) {
  std::vector<double> units;
  for (const TrainBatch& b : batches) units.push_back(static_cast<double>(strategy_->count_units(b)));
  comm_.all_reduce_sum(units.data(), units.size());
  return units;
}

void Run::all_reduce_stats(MicroStats* s, std::vector<double>* extra) {
  std::vector<double> v{s->loss_sum, static_cast<double>(s->num_targets)};
  v.insert(v.end(), s->metric_sums.begin(), s->metric_sums.end());
  v.insert(v.end(), extra->begin(), extra->end());
  comm_.all_reduce_sum(v.data(), v.size());
  s->loss_sum = v[0];
  s->num_targets = static_cast<int64_t>(v[1]);
  std::copy(v.begin() + 2, v.begin() + 2 + kMaxMetrics, s->metric_sums.begin());
  std::copy(v.begin() + 2 + kMaxMetrics, v.end(), extra->begin());
}

bool Run::stop_agreed() {
  double flag = g_stop_signal.load() != 0 ? 1.0 : 0.0;
  comm_.all_reduce_sum(&flag, 1);
  return flag > 0;
}

Json Run::validation_record() {
  Json rec{{"step", step_}};
  if (source_->validates_itself()) {
    rec.update(source_->validate(std::vector<int64_t>(val_pool_.begin(), val_pool_.begin() + val_count())));
  } else {
    const MicroStats v = validate();
    rec["val_loss"] = v.loss();
    add_metrics(v, "val_", &rec);
  }
  return rec;
}

void Run::add_metrics(const MicroStats& s, const std::string& prefix, Json* rec) const {
  for (size_t k = 0; k < metrics_.size(); ++k)
    (*rec)[prefix + metrics_[k].key] = s.num_targets > 0 ? s.metric_sums[k] / static_cast<double>(s.num_targets) : 0.0;
}

void Run::print_progress(const Json& rec, double seconds_per_step, int64_t first_step) const {
  const int width = 24;
  std::string bar(static_cast<size_t>(width * step_ / total_steps_), '=');
  bar.resize(width, ' ');
  std::string line = str_cat("step ", step_, "/", total_steps_, " [", bar, "] loss ", fixed(rec["loss"], 4));
  for (const auto& m : metrics_)
    if (!m.label.empty()) line += str_cat(" ", m.label, " ", fixed(rec[m.key], 3));
  if (rec.contains("reward_mean")) line += " reward " + fixed(rec["reward_mean"], 3);
  char rates[96];
  std::snprintf(rates, sizeof rates, " lr %.2e %.0f tok/s ETA ", rec["lr"].get<double>(),
                rec["tokens_per_s"].get<double>());
  line += rates + format_duration(seconds_per_step * static_cast<double>(total_steps_ - step_));
  if (rec.contains("val_loss")) line += " val " + fixed(rec["val_loss"], 4);
  if (rec.contains("val_reward_mean")) line += " val reward " + fixed(rec["val_reward_mean"], 3);
  const bool last = step_ == total_steps_;
  const bool validated = rec.contains("val_loss") || rec.contains("val_reward_mean");
  if (tty_) std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), last ? "\n" : "");
  else if (last || validated || step_ % 10 == 0 || step_ == first_step + 1)
    std::fprintf(stderr, "%s\n", line.c_str());
}

// The trained weights: an HF checkpoint, or with LoRA the adapter in the PEFT layout.
void Run::save_weights(const std::string& dir) const {
  if (!lora_) return save_hf_weights(dir, *model_, config_);
  lora_->save(dir, o_.model_dir.empty() ? "" : fs::absolute(o_.model_dir).lexically_normal().string());
}

void Run::save_checkpoint(int64_t step) {
  const fs::path root = fs::path(o_.output_dir) / "checkpoints";
  const fs::path final_dir = root / step_dir_name(step);
  // ZeRO-1: rank 0 gathers the moments into whole-buffer ones (the unsharded format, so any
  // number of ranks, sharded or not, resumes from it).
  FloatBuffer full_m, full_v;
  if (sharded()) {
    if (primary()) full_m = FloatBuffer(shards_->total()), full_v = FloatBuffer(shards_->total());
    comm_.gather_to_root(adam_->m().data(), full_m.data(), shards_->bounds());
    comm_.gather_to_root(adam_->v().data(), full_v.data(), shards_->bounds());
  }
  const FloatBuffer m = sharded() ? full_m : on_host(adam_->m());  // from a device: host copies
  const FloatBuffer v = sharded() ? full_v : on_host(adam_->v());
  if (!primary()) {  // every rank holds the same weights; rank 0 writes them and the state
    last_ckpt_ = final_dir.string();
    return;
  }
  fs::create_directories(root);
  const fs::path tmp = root / (".tmp-" + step_dir_name(step) + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  save_weights(tmp.string());
  model::write_safetensors((tmp / "optimizer.safetensors").string(),
                           {{"adamw.m", buffer_view(m)}, {"adamw.v", buffer_view(v)}});
  Json state;
  state["step"] = step;
  state["adamw_step"] = adam_->step_count();
  state["sampler"] = sampler_->to_json();
  state["options"] = options_fingerprint(o_, comm_.size());
  state["total_steps"] = total_steps_;
  strategy_->save_state(tmp.string());
  tokenizer::copy_tokenizer_files(tokenizer_dir_, tmp.string());
  // trainer_state.json last: a directory without it is never taken for a checkpoint.
  write_file_atomic((tmp / "trainer_state.json").string(), state.dump(2));
  if (fs::exists(final_dir)) fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  last_ckpt_ = final_dir.string();
}

void Run::load_checkpoint(const std::string& dir) {
  const Json state = read_json_file(dir + "/trainer_state.json");
  const Json fp = options_fingerprint(o_, comm_.size());
  const Json& saved = state.at("options");
  for (auto it = fp.begin(); it != fp.end(); ++it)
    ASTRAI_CHECK(saved.contains(it.key()) && saved[it.key()] == it.value(), "cannot resume from ", dir, ": ",
                 it.key() == "batch_size" ? "the global batch (--batch-size × ranks)" : "--" + flag_name(it.key()),
                 " was ", saved.value(it.key(), Json()).dump(), ", now ", it.value().dump());
  if (lora_) {
    lora_->load(dir);
    lora_->refresh();
  } else {
    auto weights = model::read_checkpoint_tensors(dir);
    model_->load_weights(weights.tensors, dir);
  }
  strategy_->load_state(dir);
  const auto opt = model::read_safetensors(dir + "/optimizer.safetensors").tensors;
  for (auto [name, buf] : {std::pair{"adamw.m", &adam_->m()}, std::pair{"adamw.v", &adam_->v()}}) {
    auto it = opt.find(name);
    ASTRAI_CHECK(it != opt.end() && it->second.dtype() == DType::kF32 &&
                     static_cast<size_t>(it->second.numel()) == shards_->total(),
                 dir, "/optimizer.safetensors: missing or mis-sized ", name);
    // Whole-buffer moments; a sharded rank takes its slice.
    buf->ops().to_device(buf->data(), static_cast<const float*>(it->second.raw()) + adam_->shard_begin(),
                         buf->size() * sizeof(float));
  }
  adam_->set_step_count(state.at("adamw_step").get<int64_t>());
  sampler_->load_json(state.at("sampler"));
  step_ = state.at("step").get<int64_t>();
  source_->after_update(step_);  // the weights are at version step_
  last_ckpt_ = dir;
}

void Run::run_micro_batches(std::vector<TrainBatch>& batches, const std::vector<double>& units, double* loss,
                            int64_t* tokens, MicroStats* stats, double* exposed_s) {
  FloatBuffer& grads = lora_ ? lora_->grads() : model_->grads();
  const bool overlap = o_.overlap_allreduce && comm_.size() > 1;
  std::vector<char> started(buckets_.size(), 0);
  // Starts the sums of the buckets complete at `event` (every rank: the same order). LoRA's
  // dL/dB = s·dL/dB̃ is formed per layer first (finish_grads).
  auto start = [&](int64_t event) {
    bool finished_lora = false;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (started[b] || buckets_[b].event != event) continue;
      if (lora_ && !finished_lora) lora_->finish_grads(event), finished_lora = true;
      comm_.start_all_reduce_sum(grads.data() + buckets_[b].begin, buckets_[b].end - buckets_[b].begin);
      started[b] = 1;
    }
    comm_.progress();
  };
  for (int64_t m = 0; m < o_.grad_accum; ++m) {
    TrainBatch& batch = batches[static_cast<size_t>(m)];
    model_->set_dropout_seed(dropout_seed(o_.seed, step_, m));
    // This rank's share of the micro-batch's units: the summed gradients are those of the
    // mean over all ranks' units (1 with one rank: the scale stays 1 / grad_accum).
    const double all = units[static_cast<size_t>(m)];
    const double share = all > 0 ? static_cast<double>(strategy_->count_units(batch)) / all : 0.0;
    // The last micro-batch completes the gradients layer by layer.
    if (overlap && m + 1 == o_.grad_accum) model_->set_grad_hook(start);
    MicroStats s;
    try {
      s = strategy_->run(*model_, batch, static_cast<float>(share / static_cast<double>(o_.grad_accum)));
    } catch (...) {
      model_->set_grad_hook(nullptr);
      throw;
    }
    model_->set_grad_hook(nullptr);
    if (all > 0) *loss += s.loss_sum / all / static_cast<double>(o_.grad_accum);
    *tokens += batch.num_tokens();
    stats->add(s);
  }
  if (overlap) {
    // The buckets no backward reported (a rank whose last micro-batch has no targets runs no
    // backward: SFT) start now, in the backward's order, so every rank starts the same sums
    // in the same order.
    for (int64_t e = config_.num_hidden_layers; e >= -1; --e) start(e);
    Timer wait;
    comm_.finish_all_reduces();
    *exposed_s = wait.seconds();
    return;
  }
  if (lora_) lora_->finish_grads();
  Timer wait;
  if (comm_.size() > 1)  // the same buckets as overlapped: the same bits
    for (const Bucket& b : buckets_) comm_.all_reduce_sum(grads.data() + b.begin, b.end - b.begin);
  *exposed_s = wait.seconds();
}

void Run::write_metrics_line(const Json& j) {
  if (!primary()) return;
  std::ofstream out(fs::path(o_.output_dir) / "metrics.jsonl", std::ios::app);
  out << j.dump() << '\n';
}

TrainResult Run::go() {
  ASTRAI_CHECK(!o_.data_dir.empty() && !o_.output_dir.empty(), "--data and --output are required");
  ASTRAI_CHECK(o_.batch_size > 0 && o_.seq_len > 0 && o_.grad_accum > 0, "--batch-size, --seq-len and --grad-accum must be positive");
  ASTRAI_CHECK(o_.label_smoothing >= 0 && o_.label_smoothing < 1, "--label-smoothing must be in [0, 1)");
  ASTRAI_CHECK(o_.train_type != "dpo" || o_.label_smoothing == 0,
               "--label-smoothing is for seq and sft; conservative DPO takes --dpo-label-smoothing");
  ASTRAI_CHECK(o_.train_type != "grpo" || o_.label_smoothing == 0, "--label-smoothing is for seq and sft, not grpo");
  ASTRAI_CHECK(o_.ppo_epochs >= 1, "--ppo-epochs must be at least 1");
  ASTRAI_CHECK(o_.lora.rank >= 0, "--lora-rank must be >= 0 (0: full fine-tuning), got ", o_.lora.rank);
  ASTRAI_CHECK(o_.lora.rank > 0 || o_.lora.dropout == 0, "--lora-dropout applies to LoRA: give --lora-rank too");
  ASTRAI_CHECK(o_.train_type == "grpo" || o_.ppo_epochs == 1, "--ppo-epochs is for --train-type grpo");
  if (o_.threads > 0) set_num_threads(o_.threads);
  else if (comm_.local_size() > 1 && std::getenv("OMP_NUM_THREADS") == nullptr)  // ranks share the cores
    set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm_.local_size()));
  setup_model();
  setup_data();
  sched_.kind = o_.schedule;
  sched_.max_lr = o_.max_lr;
  sched_.min_lr_ratio = o_.min_lr_ratio;
  sched_.warmup_steps = o_.warmup_steps;
  sched_.total_steps = total_steps_;
  validate_schedule(sched_);
  if (primary()) fs::create_directories(o_.output_dir);
  const fs::path metrics = fs::path(o_.output_dir) / "metrics.jsonl";
  if (o_.resume) {
    const std::string ckpt = latest_checkpoint(o_.output_dir);
    ASTRAI_CHECK(!ckpt.empty(), "--resume: no checkpoint under ", o_.output_dir, "/checkpoints");
    load_checkpoint(ckpt);
    if (primary()) log_info("resumed from ", ckpt, " at step ", step_);
    // Keep the metrics of the updates the checkpoint contains; later lines belong to a
    // run that was lost and will be recomputed.
    std::string kept;
    if (primary() && fs::exists(metrics)) {
      std::ifstream in(metrics);
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        const Json j = Json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.value("step", int64_t{0}) <= step_) kept += line + "\n";
      }
    }
    if (primary()) write_file_atomic(metrics.string(), kept);
  } else {
    ASTRAI_CHECK(latest_checkpoint(o_.output_dir).empty(), o_.output_dir,
                 " already holds checkpoints: pass --resume to continue, or choose another --output");
    if (primary()) write_file_atomic(metrics.string(), "");
  }
  if (lora_ && primary())
    log_info("LoRA: ", lora_->num_params(), " trainable parameters (rank ", o_.lora.rank, ", alpha ", o_.lora.alpha,
             ", ", lora_->specs().size() / 2, " projections); the other weights are frozen");
  if (primary())
    log_info("training ", model_->num_params(), " parameters (", config_.summary(), ") on ", device_name(o_.device),
             " for ", total_steps_,
             " updates of ", o_.batch_size * o_.grad_accum * comm_.size(), " ", source_->sample_noun(),
             comm_.size() > 1 ? str_cat(" (", o_.batch_size * o_.grad_accum, " on each of ", comm_.size(), " ranks)") : "");
  if (primary()) {
    const auto mib = [](double bytes) {
      return str_cat(fixed(Json(bytes / (1024.0 * 1024.0)), 2), " MiB (", static_cast<int64_t>(bytes), " bytes)");
    };
    if (sharded()) {
      std::string per_rank;
      for (int r = 0; r < comm_.size(); ++r)
        per_rank += str_cat(r == 0 ? "" : ", ", mib(2.0 * sizeof(float) * static_cast<double>(shards_->size(r))));
      log_info("optimizer state (AdamW m, v) sharded over ", comm_.size(), " ranks (--shard-optimizer): ", per_rank,
               " per rank, of ", mib(2.0 * sizeof(float) * static_cast<double>(shards_->total())));
    } else {
      log_info("optimizer state (AdamW m, v): ", mib(static_cast<double>(adam_->state_bytes())),
               comm_.size() > 1 ? " on every rank" : "",
               o_.shard_optimizer ? " (--shard-optimizer has no effect in a single process)" : "");
    }
    if (comm_.size() > 1)
      log_info("gradient all-reduce: ", buckets_.size(), " buckets, ",
               o_.overlap_allreduce ? "overlapped with the last micro-batch's backward" : "after the backward",
               o_.deterministic_allreduce ? ", summed in rank order" : "");
  }

  SignalGuard signals;
  TrainResult result;
  if (o_.val_at_start && step_ == 0 && !val_pool_.empty()) write_metrics_line(validation_record());
  Timer run_timer;
  const int64_t first_step = step_;
  // One batch per micro-batch; with --ppo-epochs k a batch of rollouts serves k updates.
  std::vector<TrainBatch> batches(static_cast<size_t>(o_.grad_accum));
  std::vector<double> units;  // per micro-batch, the loss units of all ranks
  while (step_ < total_steps_) {
    Timer step_timer;
    const double comm_s0 = comm_.seconds();
    const int64_t comm_b0 = comm_.bytes();
    model_->zero_grads();
    if (lora_) lora_->zero_grads();
    double loss = 0.0;
    int64_t tokens = 0;
    MicroStats step_stats;  // metric sums over the update's micro-batches
    if (step_ % o_.ppo_epochs == 0) {  // fresh batches
      for (TrainBatch& batch : batches) source_->fill(sampler_->next_batch(o_.batch_size), &batch);
      units = global_units(batches);
    }
    double exposed_s = 0.0;  // waiting for the gradient sums after the backward
    run_micro_batches(batches, units, &loss, &tokens, &step_stats, &exposed_s);
    FloatBuffer& params = lora_ ? lora_->params() : model_->params();
    FloatBuffer& grads = lora_ ? lora_->grads() : model_->grads();
    std::vector<double> sums{loss, static_cast<double>(tokens)};
    all_reduce_stats(&step_stats, &sums);
    loss = sums[0];
    tokens = static_cast<int64_t>(sums[1]);
    // The global norm: a squared sum per block, in block order (shards.h). Sharded, each rank
    // computes its own blocks and the others' arrive by a sum with zeros (exact): the same
    // partials, so the same norm, as when one rank computes them all.
    const int me = shard();
    std::vector<double> partials(shards_->blocks().size(), 0.0);
    block_sq_norms(grads.data(), shards_->blocks(), shards_->first_block(me), shards_->first_block(me + 1),
                   partials.data(), grads.ops());
    if (sharded()) comm_.all_reduce_sum(partials.data(), partials.size());
    const double norm = grad_norm_from_blocks(partials);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      fail("loss became ", loss, " (gradient norm ", norm, ") at update ", step_ + 1,
           "; training stopped without applying it. The last good checkpoint is ",
           last_ckpt_.empty() ? std::string("(none yet)") : last_ckpt_,
           ". Try a lower --max-lr, more --warmup-steps or --max-grad-norm.");
    }
    scale_grads(grads.data(), shards_->begin(me), shards_->end(me), clip_coefficient(norm, o_.max_grad_norm),
                grads.ops());
    const double lr = learning_rate(sched_, step_);
    adam_->step(params.data(), grads.data(), static_cast<float>(lr));  // this rank's slice when sharded
    if (sharded()) comm_.all_gather(params.data(), shards_->bounds());
    if (lora_) lora_->refresh();
    const double dt = step_timer.seconds();
    Json rec{{"step", step_ + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
             {"tokens_per_s", dt > 0 ? static_cast<double>(tokens) / dt : 0.0}, {"step_seconds", dt}};
    if (comm_.size() > 1) {  // rank 0's time in this update's collectives, and the bytes it sent into them
      rec["comm_seconds"] = comm_.seconds() - comm_s0;
      rec["comm_exposed_seconds"] = exposed_s;
      rec["comm_bytes"] = comm_.bytes() - comm_b0;
      rec["optimizer_state_bytes"] = adam_->state_bytes();
    }
    add_metrics(step_stats, "", &rec);
    source_->add_metrics(&rec);
    if (rec.contains("rollout_seconds")) {  // grpo: the rate of the training part alone
      const double train_s = dt - rec["rollout_seconds"].get<double>();
      rec["train_tokens_per_s"] = train_s > 0 ? static_cast<double>(tokens) / train_s : 0.0;
    }
    ++step_;
    strategy_->after_update(step_, *model_);
    source_->after_update(step_);
    const bool last = step_ == total_steps_;
    if (!val_pool_.empty() && ((o_.val_interval > 0 && step_ % o_.val_interval == 0) || last)) {
      rec.update(validation_record());
      if (rec.contains("val_loss")) result.last_val_loss = rec["val_loss"].get<double>();
    }
    write_metrics_line(rec);
    result.last_loss = loss;
    if (o_.progress && primary()) print_progress(rec, run_timer.seconds() / static_cast<double>(step_ - first_step), first_step);
    // A stop waits for the end of the current batch of rollouts (--ppo-epochs).
    const bool stop = stop_agreed() && step_ % o_.ppo_epochs == 0;
    if (last || stop || (o_.ckpt_interval > 0 && step_ % o_.ckpt_interval == 0)) save_checkpoint(step_);
    if (stop) {
      if (tty_ && o_.progress && primary()) std::fprintf(stderr, "\n");
      if (primary())
        log_warn("stopped by signal ", g_stop_signal.load() != 0 ? std::to_string(g_stop_signal.load()) : "(on another rank)",
                 " after update ", step_, "; checkpoint ", last_ckpt_, " (continue with --resume)");
      result.interrupted = true;
      break;
    }
  }
  if (!result.interrupted && primary()) {
    if (step_ == first_step && !last_ckpt_.empty()) log_info("nothing to do: ", last_ckpt_, " is at step ", step_);
    save_weights(o_.output_dir);
    tokenizer::copy_tokenizer_files(tokenizer_dir_, o_.output_dir);
  }
  result.steps_done = step_;
  result.last_checkpoint = last_ckpt_;
  result.primary = primary();
  return result;
}

}  // namespace

TrainResult run_training(const TrainOptions& options) {
  CommunicatorOptions co;
  co.deterministic = options.deterministic_allreduce;
  co.timeout_s = options.collective_timeout;
  const std::unique_ptr<Communicator> comm = make_communicator(co);
  try {
    Run run(options, *comm);
    return run.go();
  } catch (const std::exception& e) {
    comm->abort_all(e.what());  // other ranks would wait for this one until their timeout
    throw;
  }
}

}  // namespace astrai::train
