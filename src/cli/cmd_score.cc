// `astrai score`: log-probability of each token given its prefix, for one or several
// sequences (several are packed into one ragged batch), optionally dumping the logits.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/json.h"
#include "base/parallel.h"
#include "cli/command.h"
#include "cli/infer_flags.h"
#include "infer/kv_storage.h"
#include "kernels/cpu/softmax.h"
#include "model/transformer.h"

namespace astrai::cli {

namespace {

struct ScoreOptions {
  std::string model;
  std::vector<std::string> ids;
  std::string dump_logits;
  bool json = false;
  int threads = 0;
  int chunk = 0;
  int page_size = 16;
  std::string device = "cpu";
  std::string lora;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size()) break;
    size_t end = i;
    while (end < text.size() && text[end] != ',' && text[end] != ' ') ++end;
    const std::string tok = text.substr(i, end - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || v < INT32_MIN || v > INT32_MAX) fail("--ids: \"", tok, "\" is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    i = end;
  }
  if (ids.empty()) fail("--ids: no token ids in \"", text, "\"");
  return ids;
}

// float32 .npy, C order.
void write_npy(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t preamble = 10;
  while ((preamble + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(rows * cols) * sizeof(float));
  write_file_atomic(path, out);
}

// Forward of all sequences; with chunk > 0 each sequence is prefilled `chunk` tokens per
// step through a paged KV cache (every sequence advances in the same steps).
std::vector<float> run_forward(const model::Transformer& m, const std::vector<std::vector<int32_t>>& seqs, int chunk,
                               int page_size) {
  const int64_t vocab = m.vocab_size();
  int64_t total = 0;
  for (const auto& s : seqs) total += static_cast<int64_t>(s.size());
  std::vector<float> logits(static_cast<size_t>(total * vocab));
  model::ForwardWorkspace ws;
  if (chunk <= 0) {
    model::Batch b;
    for (const auto& s : seqs) b.add_sequence(s);
    m.forward(b, nullptr, ws, logits.data());
    return logits;
  }
  ASTRAI_CHECK(page_size > 0, "--page-size must be positive");
  model::PagedKv kv = m.kv_geometry(page_size);
  std::vector<std::vector<int32_t>> tables;
  int32_t pages = 0;
  for (const auto& s : seqs) {
    std::vector<int32_t> t;
    const int64_t need = (static_cast<int64_t>(s.size()) + page_size - 1) / page_size;
    // Pages handed out back to front so page ids never follow sequence order.
    for (int64_t p = 0; p < need; ++p) t.push_back(pages + static_cast<int32_t>(need - 1 - p));
    pages += static_cast<int32_t>(need);
    tables.push_back(std::move(t));
  }
  // The pages in the model's device memory (zero-filled host huge pages on the CPU).
  const auto storage = infer::make_backend_kv_storage(
      backend::ops_for(m.device()), infer::kv_layout(kv, m.config().num_hidden_layers), std::max(pages, 1));
  kv = storage->paged_kv();
  std::vector<int64_t> out_offset;
  int64_t off = 0;
  for (const auto& s : seqs) {
    out_offset.push_back(off);
    off += static_cast<int64_t>(s.size());
  }
  std::vector<float> step_logits;
  for (size_t begin = 0;; begin += static_cast<size_t>(chunk)) {
    model::Batch b;
    std::vector<std::pair<size_t, size_t>> rows;  // (sequence, first position) per batch slice
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (begin >= seqs[i].size()) continue;
      const size_t end = std::min(seqs[i].size(), begin + static_cast<size_t>(chunk));
      b.add_sequence(std::vector<int32_t>(seqs[i].begin() + begin, seqs[i].begin() + end),
                     static_cast<int32_t>(begin), tables[i]);
      rows.emplace_back(i, begin);
    }
    if (b.seqs.empty()) break;
    step_logits.resize(static_cast<size_t>(b.num_tokens() * vocab));
    m.forward(b, &kv, ws, step_logits.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto& sp = b.seqs[r];
      std::copy(step_logits.begin() + sp.token_begin * vocab,
                step_logits.begin() + (sp.token_begin + sp.num_tokens) * vocab,
                logits.begin() + (out_offset[rows[r].first] + static_cast<int64_t>(rows[r].second)) * vocab);
    }
  }
  return logits;
}

void run_score(const ScoreOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& s : o.ids) seqs.push_back(parse_ids(s));
  const model::Transformer m =
      model::Transformer::load(o.model, model::WeightPlacement::kMapped, parse_device(o.device), o.lora);
  const int64_t vocab = m.vocab_size();
  for (size_t s = 0; s < seqs.size(); ++s)
    for (size_t i = 0; i < seqs[s].size(); ++i)
      if (seqs[s][i] < 0 || seqs[s][i] >= vocab)
        fail("--ids: token id ", seqs[s][i], " (sequence ", s, ", position ", i, ") is outside the vocabulary [0, ",
             vocab, ")");
  // The model's context, as the engine enforces it; dynamic RoPE scaling is defined past it
  // (it rescales the frequencies from the sequence's length), so those models score any length.
  const model::ModelConfig& c = m.config();
  if (c.rope_scaling.type != model::RopeScalingType::kDynamic)
    for (size_t s = 0; s < seqs.size(); ++s)
      if (static_cast<int64_t>(seqs[s].size()) > c.context_length())
        fail("--ids: sequence ", s, " has ", seqs[s].size(), " tokens but the model's context holds ",
             c.context_length(), " (max_position_embeddings of its config); score a shorter window, or use "
             "`astrai eval perplexity`, which slides one over long texts");
  const std::vector<float> logits = run_forward(m, seqs, o.chunk, o.page_size);

  Json all = Json::array();
  int64_t row = 0;
  std::vector<float> lsm(static_cast<size_t>(vocab));
  for (const auto& ids : seqs) {
    Json lps = Json::array();
    lps.push_back(nullptr);
    double total = 0;
    for (size_t i = 1; i < ids.size(); ++i) {
      const float* lr = logits.data() + (row + static_cast<int64_t>(i) - 1) * vocab;
      const double lp = static_cast<double>(lr[ids[i]]) - kernels::logsumexp(lr, vocab);
      total += lp;
      lps.push_back(lp);
    }
    row += static_cast<int64_t>(ids.size());
    if (o.json) {
      all.push_back(Json{{"ids", ids}, {"logprobs", lps}});
    } else {
      std::printf("position\tid\tlogprob\n");
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i == 0) {
          std::printf("%zu\t%d\t-\n", i, ids[i]);
        } else {
          std::printf("%zu\t%d\t%.6f\n", i, ids[i], lps[i].get<double>());
        }
      }
      const double n = static_cast<double>(ids.size() - 1);
      if (n > 0) std::printf("total logprob %.6f, perplexity %.4f over %zu predicted tokens\n", total,
                             std::exp(-total / n), ids.size() - 1);
    }
  }
  if (o.json) std::cout << (all.size() == 1 ? all[0] : all).dump() << "\n";
  if (!o.dump_logits.empty()) write_npy(o.dump_logits, logits.data(), row, vocab);
}

void setup_score(CLI::App& app) {
  auto opts = std::make_shared<ScoreOptions>();
  CLI::App* cmd = app.add_subcommand("score", "Log-probability of each token of a sequence given its prefix");
  cmd->add_option("--model", opts->model, "Model directory (config.json + safetensors) or GGUF file")->required();
  cmd->add_option("--ids", opts->ids,
                  "Comma-separated token ids; repeat the option to score several sequences in one packed batch")
      ->required();
  cmd->add_option("--dump-logits", opts->dump_logits, "Write the logits as float32 .npy [tokens, vocab]");
  cmd->add_flag("--json", opts->json, "Print {\"ids\": [...], \"logprobs\": [null, ...]} (a list for several)");
  cmd->add_option("--threads", opts->threads, "Threads (default: all cores)");
  cmd->add_option("--chunk", opts->chunk,
                  "Prefill through a paged KV cache, this many tokens per step (0: one forward, no cache)");
  cmd->add_option("--page-size", opts->page_size, "KV page size with --chunk");
  add_device_option(cmd, &opts->device);
  add_lora_option(cmd, &opts->lora);
  cmd->callback([opts] { run_score(*opts); });
}

const bool kRegistered = register_command(&setup_score);

}  // namespace

}  // namespace astrai::cli
