// Driver for the PyTorch oracle (oracle_train.py): loads a config, parameters and
// micro-batches written by the script, runs our forward/backward and AdamW steps, and writes
// the first step's loss and every parameter gradient plus the loss of each step.
//   train_oracle_tool DIR   (DIR/config.json, DIR/case.json, DIR/params.safetensors, and for
//                            dpo and grpo DIR/ref_params.safetensors: the reference policy)
#include <cstdio>
#include <memory>
#include <vector>

#include "base/files.h"
#include "base/json.h"
#include "base/parallel.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/params.h"
#include "train/dpo.h"
#include "train/lora.h"
#include "train/strategy.h"

using namespace astrai;
using namespace astrai::train;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    // The same parser as every `astrai` command: what the forward accepts, the trainer accepts.
    const auto config = model::ModelConfig::from_json(read_json_file(dir + "/config.json"), dir + "/config.json");
    const Json c = read_json_file(dir + "/case.json");
    // LoRA: the base is frozen and read in place; otherwise every parameter trains.
    const bool with_lora = c.contains("lora");
    TrainModel model(config, c.value("recompute", false), /*trainable=*/!with_lora);
    const std::string params_file = dir + "/params.safetensors";
    const auto base = astrai::model::read_safetensors(params_file).tensors;
    if (with_lora) model.view_weights(base, params_file);
    else model.load_weights(base, params_file);

    std::vector<TrainBatch> micro;
    for (const auto& mb : c["micro_batches"]) {
      TrainBatch b;
      for (const auto& p : mb.value("pairs", Json::array()))
        add_preference_pair(&b, p["chosen"].get<std::vector<int32_t>>(), p["chosen_mask"].get<std::vector<uint8_t>>(),
                            p["rejected"].get<std::vector<int32_t>>(), p["rejected_mask"].get<std::vector<uint8_t>>());
      for (const auto& c : mb.value("completions", Json::array())) {  // grpo rollouts
        const auto mask = c["mask"].get<std::vector<uint8_t>>();
        b.add_document(c["ids"].get<std::vector<int32_t>>(), &mask);
        b.advantages.push_back(c["advantage"].get<float>());
      }
      if (mb.contains("behaviour_logp")) b.behaviour_logp = mb["behaviour_logp"].get<std::vector<float>>();
      for (size_t d = 0; d < mb.value("docs", Json::array()).size(); ++d) {
        const auto ids = mb["docs"][d].get<std::vector<int32_t>>();
        if (mb.contains("masks")) {
          const auto mask = mb["masks"][d].get<std::vector<uint8_t>>();
          b.add_document(ids, &mask);
        } else {
          b.add_document(ids);
        }
      }
      micro.push_back(std::move(b));
    }
    StrategyOptions so;
    so.train_type = c.value("train_type", "seq");
    so.label_smoothing = c.value("label_smoothing", 0.0f);
    so.dpo_beta = c.value("dpo_beta", 0.1f);
    so.dpo_loss = c.value("dpo_loss", std::string("sigmoid"));
    so.dpo_label_smoothing = c.value("dpo_label_smoothing", 0.0f);
    so.clip_eps = c.value("clip_eps", 0.2f);
    so.kl_coef = c.value("kl_coef", 0.01f);
    TrainModel reference(config);
    if (so.train_type == "dpo" || so.train_type == "grpo")
      reference.load_weights(astrai::model::read_safetensors(dir + "/ref_params.safetensors").tensors,
                             dir + "/ref_params.safetensors");
    auto strategy = make_strategy(so, reference);
    AdamWConfig oc;
    oc.beta1 = c.value("beta1", 0.9f);
    oc.beta2 = c.value("beta2", 0.95f);
    oc.eps = c.value("eps", 1e-8f);
    oc.weight_decay = c.value("weight_decay", 0.1f);
    // LoRA: the factors (DIR/adapter, PEFT layout) are what is trained, in the layers.
    std::unique_ptr<LoraAdapters> lora;
    if (with_lora) {
      LoraOptions lo;
      lo.rank = c["lora"]["rank"].get<int64_t>();
      lo.alpha = c["lora"]["alpha"].get<double>();
      lo.dropout = c["lora"].value("dropout", 0.0);
      lo.targets = c["lora"]["targets"].get<std::vector<std::string>>();
      lora = std::make_unique<LoraAdapters>(model, lo, 1);
      lora->load(dir + "/adapter");
      lora->refresh();
      model.set_adapters(lora->layer_adapters(), lo.rank);
    }
    AdamW adam = lora ? AdamW(lora->specs(), lora->num_params(), oc) : AdamW(model.layout(), oc);
    FloatBuffer& params = lora ? lora->params() : model.params();
    FloatBuffer& grads = lora ? lora->grads() : model.grads();
    const auto lrs = c["lrs"].get<std::vector<double>>();
    const double max_norm = c.value("max_grad_norm", 0.0);

    Json result;
    std::vector<double> losses, norms;
    std::vector<std::vector<double>> metrics;  // per step: mean of each strategy metric
    for (size_t step = 0; step < lrs.size(); ++step) {
      model.zero_grads();
      if (lora) lora->zero_grads();
      double loss = 0.0;
      MicroStats sums;
      for (size_t m = 0; m < micro.size(); ++m) {
        const TrainBatch& b = micro[m];
        model.set_dropout_seed(1000 * step + m);  // oracle_train.py draws the same masks
        const MicroStats s = strategy->run(model, b, 1.0f / static_cast<float>(micro.size()));
        loss += s.loss() / micro.size();
        sums.add(s);
      }
      std::vector<double> means;
      for (size_t k = 0; k < strategy->metrics().size(); ++k) means.push_back(sums.metric_sums[k] / sums.num_targets);
      metrics.push_back(means);
      if (lora) lora->finish_grads();
      if (step == 0) {
        std::vector<std::pair<std::string, Tensor>> tensors;
        for (const auto& s : lora ? lora->specs() : model.layout().specs())
          tensors.emplace_back(s.name, buffer_view(grads, s.offset, s.shape));
        astrai::model::write_safetensors(dir + "/grads.safetensors", tensors);
      }
      norms.push_back(clip_grad_norm(grads.data(), grads.size(), max_norm));
      adam.step(params.data(), grads.data(), static_cast<float>(lrs[step]));
      if (lora) lora->refresh();
      losses.push_back(loss);
    }
    result["losses"] = losses;
    result["grad_norms"] = norms;
    result["metrics"] = metrics;
    write_file_atomic(dir + "/result.json", result.dump());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
