// llama.cpp's side of bench/llamacpp/gguf_check.py: loads a GGUF with libllama and, for each
// input line, writes the token ids and the logits of every position.
//   llama_logits MODEL.gguf OUTDIR < lines
// A line is "ids 1 2 3" (token ids) or "hex 48656c6c6f" (UTF-8 text, tokenized by llama.cpp with
// its special tokens added and parsed). For line k: OUTDIR/k.ids (the ids, space separated) and
// OUTDIR/k.f32 (n_tokens x n_vocab float32 logits). The KV cache is f32 and flash attention off,
// so the comparison measures the weights' arithmetic, not a 16-bit cache.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.gguf OUTDIR < lines\n", argv[0]);
    return 2;
  }
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::string line;
  int k = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::vector<llama_token> ids;
    if (line.rfind("ids ", 0) == 0) {
      std::istringstream in(line.substr(4));
      for (int id; in >> id;) ids.push_back(id);
    } else if (line.rfind("hex ", 0) == 0) {
      const std::string text = from_hex(line.substr(4));
      ids.resize(text.size() + 8);
      const int n = llama_tokenize(vocab, text.data(), static_cast<int>(text.size()), ids.data(),
                                   static_cast<int>(ids.size()), /*add_special=*/true, /*parse_special=*/true);
      if (n < 0) return 1;
      ids.resize(n);
    } else {
      std::fprintf(stderr, "bad line: %s\n", line.c_str());
      return 2;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>(ids.size() + 16);
    cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(ids.size());
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      batch.token[i] = ids[i];
      batch.pos[i] = static_cast<llama_pos>(i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    batch.n_tokens = static_cast<int32_t>(ids.size());
    if (llama_decode(ctx, batch) != 0) return 1;
    const std::string base = std::string(argv[2]) + "/" + std::to_string(k++);
    std::ofstream idf(base + ".ids");
    for (size_t i = 0; i < ids.size(); ++i) idf << (i ? " " : "") << ids[i];
    std::ofstream lf(base + ".f32", std::ios::binary);
    for (size_t i = 0; i < ids.size(); ++i)
      lf.write(reinterpret_cast<const char*>(llama_get_logits_ith(ctx, static_cast<int32_t>(i))),
               sizeof(float) * n_vocab);
    llama_batch_free(batch);
    llama_free(ctx);
  }
  llama_model_free(model);
  return 0;
}
