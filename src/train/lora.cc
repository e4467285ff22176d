#include "train/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "train/params.h"

namespace astrai::train {

namespace {

const std::map<std::string, std::string> kModules = {{"q", "self_attn.q_proj"},   {"k", "self_attn.k_proj"},
                                                     {"v", "self_attn.v_proj"},   {"o", "self_attn.o_proj"},
                                                     {"gate", "mlp.gate_proj"},   {"up", "mlp.up_proj"},
                                                     {"down", "mlp.down_proj"}};

// The short target name of a parameter ("q" for model.layers.3.self_attn.q_proj.weight), or "".
std::string target_of(const std::string& name) {
  for (const auto& [short_name, module] : kModules) {
    const std::string suffix = "." + module + ".weight";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return short_name;
  }
  return "";
}

}  // namespace

std::vector<std::string> parse_lora_targets(const std::string& list) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= list.size()) {
    const size_t e = std::min(list.find(',', b), list.size());
    const std::string t = list.substr(b, e - b);
    ASTRAI_CHECK(kModules.count(t), "--lora-targets: unknown projection \"", t, "\" (q, k, v, o, gate, up, down)");
    out.push_back(t);
    b = e + 1;
  }
  return out;
}

namespace {

// The layer index of "model.layers.12.mlp.up_proj.weight".
int64_t layer_of(const std::string& name) {
  const std::string prefix = "model.layers.";
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
}

int64_t projection_index(const std::string& target) {
  static const std::vector<std::string> order = {"q", "k", "v", "o", "gate", "up", "down"};  // kLoraProjections
  return std::find(order.begin(), order.end(), target) - order.begin();
}

}  // namespace

LoraAdapters::LoraAdapters(const TrainModel& base, const LoraOptions& options, uint64_t seed)
    : options_(options), num_layers_(base.config().num_hidden_layers), base_weights_(base.weights()) {
  ASTRAI_CHECK(options_.rank > 0, "--lora-rank must be positive");
  ASTRAI_CHECK(options_.alpha > 0, "--lora-alpha must be positive");
  ASTRAI_CHECK(options_.dropout >= 0 && options_.dropout < 1, "--lora-dropout must be in [0, 1), got ", options_.dropout);
  size_t total = 0;
  std::vector<int> used(options_.targets.size(), 0);
  for (const auto& s : base.layout().specs()) {
    const std::string t = target_of(s.name);
    size_t which = options_.targets.size();
    for (size_t i = 0; i < options_.targets.size(); ++i)
      if (options_.targets[i] == t) which = i;
    if (t.empty() || which == options_.targets.size()) continue;
    ++used[which];
    Target g;
    g.layer = layer_of(s.name);
    g.projection = projection_index(t);
    g.out = s.shape[0];
    g.in = s.shape[1];
    g.module = s.name.substr(0, s.name.size() - std::string(".weight").size());
    g.base = base_weights_.at(s.name);
    g.a_offset = total;
    total += static_cast<size_t>(options_.rank * g.in);
    g.b_offset = total;
    total += static_cast<size_t>(g.out * options_.rank);
    specs_.push_back({g.module + ".lora_A.weight", {options_.rank, g.in}, model::ParamKind::kMatrix, g.a_offset,
                      static_cast<size_t>(options_.rank * g.in)});
    specs_.push_back({g.module + ".lora_B.weight", {g.out, options_.rank}, model::ParamKind::kMatrix, g.b_offset,
                      static_cast<size_t>(g.out * options_.rank)});
    targets_.push_back(g);
  }
  for (size_t i = 0; i < used.size(); ++i)
    ASTRAI_CHECK(used[i] > 0, "--lora-targets: this ", base.config().model_type, " model has no ",
                 kModules.at(options_.targets[i]), " projection");
  params_ = FloatBuffer(total);
  grads_ = FloatBuffer(total);
  scaled_b_ = FloatBuffer(total);
  std::mt19937_64 rng(seed ^ 0x4c6f5241ull);
  for (const Target& g : targets_) {
    // PEFT's default: kaiming_uniform(a = sqrt(5)) on A, i.e. U(-1/sqrt(in), 1/sqrt(in)); B = 0.
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(static_cast<float>(g.in)),
                                            1.0f / std::sqrt(static_cast<float>(g.in)));
    for (int64_t i = 0; i < options_.rank * g.in; ++i) params_.data()[g.a_offset + i] = u(rng);
  }
}

std::vector<model::LayerLora> LoraAdapters::layer_adapters() const {
  std::vector<model::LayerLora> layers(static_cast<size_t>(num_layers_));
  const int64_t r = options_.rank;
  for (const Target& g : targets_) {
    model::ProjectionLora& p = layers[static_cast<size_t>(g.layer)].*kLoraProjections[static_cast<size_t>(g.projection)];
    p.a = backend::Weight{params_.data() + g.a_offset, DType::kF32, r, g.in};
    p.b = backend::Weight{scaled_b_.data() + g.b_offset, DType::kF32, g.out, r};
    p.da = grads_.data() + g.a_offset;
    p.db = grads_.data() + g.b_offset;
    p.dropout = static_cast<float>(options_.dropout);
  }
  return layers;
}

void LoraAdapters::zero_grads() { std::memset(grads_.data(), 0, grads_.size() * sizeof(float)); }

void LoraAdapters::finish_grads(int64_t layer) {
  const float s = static_cast<float>(scale());
  for (const Target& g : targets_) {
    if (layer >= 0 && g.layer != layer) continue;
    float* db = grads_.data() + g.b_offset;
    for (int64_t i = 0; i < g.out * options_.rank; ++i) db[i] *= s;
  }
}

void LoraAdapters::refresh() {
  const float s = static_cast<float>(scale());
  for (const Target& g : targets_) {
    const float* b = params_.data() + g.b_offset;
    float* bs = scaled_b_.data() + g.b_offset;
    for (int64_t i = 0; i < g.out * options_.rank; ++i) bs[i] = s * b[i];
  }
  if (merged_.size() > 0) merge();
}

void LoraAdapters::merge() {
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& g = targets_[i];
    float* dst = merged_.data() + merged_offsets_[i];
    const float* base = g.base.data<float>();
    if (g.base.dtype() != DType::kF32) {  // a bf16/f16 base: widened in place first
      convert_to_f32(g.base.dtype(), g.base.raw(), dst, static_cast<size_t>(g.out * g.in));
      base = dst;
    }
    model::lora_merge_matrix(base, params_.data() + g.a_offset, params_.data() + g.b_offset, g.out, g.in,
                             options_.rank, scale(), dst);
  }
}

std::map<std::string, Tensor> LoraAdapters::merged_weights() {
  if (merged_.size() == 0) {
    size_t total = 0;
    for (const Target& g : targets_) {
      merged_offsets_.push_back(total);
      total += static_cast<size_t>((g.out * g.in + 15) / 16 * 16);
    }
    merged_ = FloatBuffer(total);
    merge();
  }
  std::map<std::string, Tensor> out = base_weights_;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Target& g = targets_[i];
    out.insert_or_assign(g.module + ".weight", buffer_view(merged_, merged_offsets_[i], {g.out, g.in}));
  }
  return out;
}

void LoraAdapters::save(const std::string& dir, const std::string& base_model) const {
  const FloatBuffer host = on_host(params_);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& s : specs_) tensors.emplace_back("base_model.model." + s.name, buffer_view(host, s.offset, s.shape));
  model::write_safetensors(dir + "/adapter_model.safetensors", tensors);
  Json targets = Json::array();
  for (const auto& t : options_.targets) targets.push_back(kModules.at(t).substr(kModules.at(t).find('.') + 1));
  const Json config{{"peft_type", "LORA"},   {"r", options_.rank},     {"lora_alpha", options_.alpha},
                    {"lora_dropout", options_.dropout},   {"target_modules", targets}, {"bias", "none"},
                    {"use_rslora", false},   {"fan_in_fan_out", false},   {"task_type", "CAUSAL_LM"},
                    {"inference_mode", true}};
  Json config_with_base = config;
  if (!base_model.empty()) config_with_base["base_model_name_or_path"] = base_model;
  write_file_atomic(dir + "/adapter_config.json", config_with_base.dump(2));
}

void LoraAdapters::load(const std::string& dir) {
  const model::LoraAdapter a = model::load_lora(dir);  // validates the files, names and ranks
  ASTRAI_CHECK(a.rank == options_.rank && a.alpha == options_.alpha && !a.rslora, dir, ": the adapter has r ", a.rank,
               ", alpha ", a.alpha, a.rslora ? " (rsLoRA)" : "", "; this run has --lora-rank ", options_.rank,
               ", --lora-alpha ", options_.alpha);
  ASTRAI_CHECK(a.factors.size() == targets_.size(), dir, ": the adapter changes ", a.factors.size(),
               " projections; this run adapts ", targets_.size());
  for (const Target& g : targets_) {
    auto it = a.factors.find(g.module + ".weight");
    ASTRAI_CHECK(it != a.factors.end() && it->second.first.dim(1) == g.in && it->second.second.dim(0) == g.out, dir,
                 ": no adapter of the right shape for ", g.module);
    std::memcpy(params_.data() + g.a_offset, it->second.first.data<float>(), static_cast<size_t>(options_.rank * g.in) * sizeof(float));
    std::memcpy(params_.data() + g.b_offset, it->second.second.data<float>(),
                static_cast<size_t>(g.out * options_.rank) * sizeof(float));
  }
}

}  // namespace astrai::train
