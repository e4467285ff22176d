#include "model/lora.h"

#include <cmath>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "model/safetensors.h"

namespace astrai::model {

namespace {

constexpr const char* kPrefix = "base_model.model.";

bool strip(std::string* s, const std::string& suffix) {
  if (s->size() < suffix.size() || s->compare(s->size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  s->resize(s->size() - suffix.size());
  return true;
}

void check_config(const Json& c, const std::string& path) {
  ASTRAI_CHECK(c.value("bias", std::string("none")) == "none", path, ": \"bias\": \"", c.value("bias", std::string()),
               "\" (trained biases) is not supported; only \"none\"");
  ASTRAI_CHECK(!c.contains("modules_to_save") || c["modules_to_save"].is_null() || c["modules_to_save"].empty(), path,
               ": \"modules_to_save\" (fully trained modules) is not supported");
  ASTRAI_CHECK(!c.value("use_dora", false), path, ": DoRA (\"use_dora\": true) is not supported");
  ASTRAI_CHECK(!c.value("fan_in_fan_out", false), path, ": \"fan_in_fan_out\": true is not supported");
}

}  // namespace

double LoraAdapter::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

LoraAdapter load_lora(const std::string& dir) {
  const std::string config_path = dir + "/adapter_config.json";
  const std::string weights_path = dir + "/adapter_model.safetensors";
  ASTRAI_CHECK(file_exists(config_path), dir, ": no adapter_config.json (a LoRA adapter directory in the PEFT layout)");
  ASTRAI_CHECK(file_exists(weights_path), dir, ": no adapter_model.safetensors");
  const Json c = read_json_file(config_path);
  check_config(c, config_path);
  LoraAdapter a;
  ASTRAI_CHECK(c.contains("r") && c["r"].is_number_integer() && c["r"].get<int64_t>() > 0, config_path,
               ": \"r\" must be a positive integer");
  ASTRAI_CHECK(c.contains("lora_alpha") && c["lora_alpha"].is_number(), config_path, ": \"lora_alpha\" is required");
  a.rank = c["r"].get<int64_t>();
  a.alpha = c["lora_alpha"].get<double>();
  a.rslora = c.value("use_rslora", false);
  std::map<std::string, Tensor> as, bs;
  for (auto& [name, t] : read_safetensors(weights_path).tensors) {
    std::string n = name;
    ASTRAI_CHECK(n.rfind(kPrefix, 0) == 0, weights_path, ": tensor ", name, " does not start with ", kPrefix);
    n = n.substr(std::string(kPrefix).size());
    strip(&n, ".default.weight") || strip(&n, ".weight");  // PEFT saves without the adapter name
    const bool is_a = strip(&n, ".lora_A"), is_b = !is_a && strip(&n, ".lora_B");
    ASTRAI_CHECK(is_a || is_b, weights_path, ": tensor ", name, " is neither lora_A nor lora_B");
    ASTRAI_CHECK(t.ndim() == 2, weights_path, ": ", name, " must be a matrix");
    (is_a ? as : bs)[n + ".weight"] = t;
  }
  ASTRAI_CHECK(!as.empty(), weights_path, ": no LoRA tensors");
  for (auto& [n, A] : as) {
    auto it = bs.find(n);
    ASTRAI_CHECK(it != bs.end(), weights_path, ": ", n, " has lora_A but no lora_B");
    const Tensor& B = it->second;
    ASTRAI_CHECK(A.dim(0) == a.rank && B.dim(1) == a.rank, weights_path, ": ", n, ": lora_A is [", A.dim(0), ", ",
                 A.dim(1), "] and lora_B [", B.dim(0), ", ", B.dim(1), "], expected rank ", a.rank);
    a.factors[n] = {A.to(DType::kF32), B.to(DType::kF32)};
  }
  ASTRAI_CHECK(as.size() == bs.size(), weights_path, ": a lora_B without its lora_A");
  return a;
}

void lora_merge_matrix(const float* base, const float* A, const float* B, int64_t out, int64_t in, int64_t r,
                       double s, float* dst) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += static_cast<double>(B[o * r + k]) * A[k * in + i];
      dst[o * in + i] = static_cast<float>(base[o * in + i] + s * acc);
    }
  }
}

int merge_lora(const ModelConfig& config, ModelWeights* weights, const LoraAdapter& adapter, const std::string& where) {
  std::map<std::string, Tensor*> slots;
  for (auto& p : weights->params(config)) slots[p.name] = p.tensor;
  const double s = adapter.scale();
  int merged = 0;
  for (const auto& [name, ab] : adapter.factors) {
    auto it = slots.find(name);
    ASTRAI_CHECK(it != slots.end(), where, ": the adapter changes ", name, ", which this ", config.model_type,
                 " model does not have");
    Tensor& w = *it->second;
    const Tensor &A = ab.first, &B = ab.second;
    const int64_t out = w.dim(0), in = w.dim(1), r = adapter.rank;
    ASTRAI_CHECK(w.ndim() == 2 && B.dim(0) == out && A.dim(1) == in, where, ": ", name, " is [", out, ", ", in,
                 "] but the adapter's B·A is [", B.dim(0), ", ", A.dim(1), "]");
    Tensor m = w.to(DType::kF32);  // an owned copy: the checkpoint's mapping is read-only
    lora_merge_matrix(m.data<float>(), A.data<float>(), B.data<float>(), out, in, r, s, m.data<float>());
    w = std::move(m);
    ++merged;
  }
  return merged;
}

}  // namespace astrai::model
