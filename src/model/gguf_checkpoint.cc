#include "model/gguf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "base/error.h"
#include "base/log.h"

namespace astrai::model {

namespace {

// GGML type ids (ggml.h's enum ggml_type) that a checkpoint may hold, and the DType of each.
std::optional<DType> dtype_of_ggml(uint32_t type) {
  switch (type) {
    case 0: return DType::kF32;
    case 1: return DType::kF16;
    case 2: return DType::kQ4_0;
    case 8: return DType::kQ8_0;
    case 12: return DType::kQ4_K;
    case 13: return DType::kQ5_K;
    case 14: return DType::kQ6_K;
    case 30: return DType::kBF16;
    default: return std::nullopt;
  }
}

// llama.cpp's older 32-weight block types, which llama-quantize still writes where a k-quant does
// not fit a matrix's width (Q4_K_M puts Q5_0, Q5_K_M Q5_1, in matrices whose input width is not a
// multiple of 256: most of Qwen2.5-0.5B's). We have no kernels of their own for them; they are
// rewritten at load into a type we have, value for value: Q5_0 (d * (q - 16), q of 5 bits) into
// Q8_0 with the same d (34 bytes instead of 22 per 32 weights), Q4_1 and Q5_1 (d * q + m) into f32.
enum class LegacyType { kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7 };

std::optional<LegacyType> legacy_type(uint32_t type) {
  if (type == 3 || type == 6 || type == 7) return static_cast<LegacyType>(type);
  return std::nullopt;
}

int64_t legacy_block_bytes(LegacyType t) { return t == LegacyType::kQ4_1 ? 20 : t == LegacyType::kQ5_0 ? 22 : 24; }

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The 32 unsigned quants of a Q4_1 / Q5_0 / Q5_1 block (5-bit types: the fifth bit of element e
// is bit e of qh); element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
void legacy_quants(LegacyType t, const uint8_t* blk, uint8_t* q) {
  const bool five = t != LegacyType::kQ4_1;
  const uint8_t* qs = blk + (t == LegacyType::kQ5_0 ? 6 : t == LegacyType::kQ5_1 ? 8 : 4);
  uint32_t qh = 0;
  if (five) std::memcpy(&qh, blk + (t == LegacyType::kQ5_0 ? 2 : 4), 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 15) | (five ? ((qh >> j) & 1) << 4 : 0));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0));
  }
}

// `blocks` blocks of type t at src as Q8_0 (Q5_0) or f32 (Q4_1, Q5_1) at dst.
void widen_legacy_blocks(LegacyType t, const uint8_t* src, int64_t blocks, uint8_t* dst) {
  uint8_t q[32];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * legacy_block_bytes(t);
    legacy_quants(t, blk, q);
    if (t == LegacyType::kQ5_0) {
      uint8_t* out = dst + b * kQ8BlockBytes;
      std::memcpy(out, blk, 2);  // the same f16 d
      for (int e = 0; e < 32; ++e) out[2 + e] = static_cast<uint8_t>(static_cast<int8_t>(q[e] - 16));
    } else {
      const float d = f16_to_f32(u16_at(blk)), m = f16_to_f32(u16_at(blk + 2));
      float* out = reinterpret_cast<float*>(dst) + b * 32;
      for (int e = 0; e < 32; ++e) out[e] = static_cast<float>(q[e]) * d + m;  // the product is exact: one rounding
    }
  }
}

// The metadata value `key`, which must have JSON type `ok` when present.
template <typename T>
std::optional<T> meta(const GgufFile& g, const std::string& key) {
  auto it = g.metadata.find(key);
  if (it == g.metadata.end()) return std::nullopt;
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) fail(g.file->path(), ": GGUF key ", key, " must be a string");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) fail(g.file->path(), ": GGUF key ", key, " must be a bool");
  } else {
    if (!it->is_number()) fail(g.file->path(), ": GGUF key ", key, " must be a number (not an array or string)");
  }
  return it->get<T>();
}

const GgufTensorRecord* find_tensor(const GgufFile& g, const std::string& name) {
  for (const auto& t : g.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// GGUF tensor name -> the Hugging Face name of the same parameter.
std::string hf_name(const std::string& gguf) {
  static const std::map<std::string, std::string> top = {{"token_embd.weight", "model.embed_tokens.weight"},
                                                         {"output_norm.weight", "model.norm.weight"},
                                                         {"output.weight", "lm_head.weight"}};
  if (auto it = top.find(gguf); it != top.end()) return it->second;
  static const std::map<std::string, std::string> layer = {
      {"attn_norm", "input_layernorm"},  {"ffn_norm", "post_attention_layernorm"},
      {"attn_q", "self_attn.q_proj"},    {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},    {"attn_output", "self_attn.o_proj"},
      {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
      {"ffn_gate", "mlp.gate_proj"},     {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"}};
  if (gguf.rfind("blk.", 0) != 0) return gguf;
  const size_t dot = gguf.find('.', 4);
  const size_t last = gguf.rfind('.');
  if (dot == std::string::npos || last <= dot) return gguf;
  const std::string index = gguf.substr(4, dot - 4);
  auto it = layer.find(gguf.substr(dot + 1, last - dot - 1));
  if (it == layer.end() || index.empty() || !std::all_of(index.begin(), index.end(), ::isdigit)) return gguf;
  return "model.layers." + index + "." + it->second + gguf.substr(last);
}

// llama.cpp's converter stores q and k (weights and biases) of llama models with the rows of each
// head reordered for its adjacent-pair RoPE: stored row h*d + 2j + s holds original row
// h*d + s*d/2 + j. Copies the rows back into the Hugging Face order (whole rows, so quantized
// blocks stay intact).
Tensor unpermute_rope_rows(const Tensor& t, int64_t heads, const std::string& where) {
  const int64_t rows = t.dim(0);
  if (heads <= 0 || rows % heads != 0 || (rows / heads) % 2 != 0)
    fail(where, ": ", rows, " rows cannot be split into ", heads, " heads of an even width");
  const int64_t d = rows / heads;
  const size_t row_bytes = dtype_bytes(t.dtype(), t.ndim() == 2 ? t.dim(1) : 1);
  Tensor out(make_host_storage(t.nbytes()), 0, t.shape(), t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < d / 2; ++j)
      for (int64_t s = 0; s < 2; ++s)
        std::memcpy(dst + (h * d + s * (d / 2) + j) * row_bytes, src + (h * d + 2 * j + s) * row_bytes, row_bytes);
  return out;
}

// A Q4_1 / Q5_0 / Q5_1 tensor rewritten in memory as Q8_0 or f32 (see LegacyType).
Tensor widened_legacy_tensor(const GgufFile& g, const GgufTensorRecord& r, LegacyType t, const std::string& where) {
  Shape shape(r.dims.rbegin(), r.dims.rend());
  if (r.dims[0] % 32 != 0) fail(where, " rows of ", r.dims[0], " elements are not whole ", ggml_type_name(r.ggml_type), " blocks");
  const int64_t blocks = shape_numel(shape) / 32;
  const uint64_t bytes = static_cast<uint64_t>(blocks * legacy_block_bytes(t));
  if (r.offset > g.file->size() || bytes > g.file->size() - r.offset)
    fail(where, " needs ", bytes, " bytes at offset ", r.offset, " but the file has ", g.file->size(),
         ": truncated file?");
  const DType to = t == LegacyType::kQ5_0 ? DType::kQ8_0 : DType::kF32;
  const size_t out_bytes = dtype_bytes(to, shape_numel(shape));
  Tensor out(make_host_storage(out_bytes), 0, std::move(shape), to);
  widen_legacy_blocks(t, g.file->data() + r.offset, blocks, static_cast<uint8_t*>(out.raw()));
  return out;
}

// The GGUF tensor as a Tensor over the mapping, shape in our order (slowest dimension first);
// llama.cpp's older block types rewritten in memory (widened_legacy_tensor).
Tensor mapped_tensor(const GgufFile& g, const GgufTensorRecord& r) {
  const std::string where = g.file->path() + ": tensor \"" + r.name + "\"";
  if (const auto legacy = legacy_type(r.ggml_type)) return widened_legacy_tensor(g, r, *legacy, where);
  const auto dtype = dtype_of_ggml(r.ggml_type);
  if (!dtype)
    fail(where, " has type ", ggml_type_name(r.ggml_type),
         "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, and Q4_1, Q5_0, Q5_1 (rewritten in memory as f32, "
         "Q8_0, f32); llama-quantize with one of those rewrites a file");
  Shape shape(r.dims.rbegin(), r.dims.rend());
  if (r.dims[0] % dtype_block(*dtype) != 0)
    fail(where, " rows of ", r.dims[0], " elements are not whole ", dtype_name(*dtype), " blocks");
  const size_t bytes = dtype_bytes(*dtype, shape_numel(shape));
  if (r.offset > g.file->size() || bytes > g.file->size() - r.offset)
    fail(where, " needs ", bytes, " bytes at offset ", r.offset, " but the file has ", g.file->size(),
         ": truncated file?");
  return Tensor(make_mapped_storage(g.file, r.offset, bytes), 0, std::move(shape), *dtype);
}

// llama.cpp's YaRN metadata as a Hugging Face rope_scaling object. The attention factor is what
// llama.cpp multiplies cos/sin by in the end: the paper's 0.1 ln(factor) + 1 (or, with
// yarn_log_multiplier m, its ratio to 0.1 m ln(factor) + 1), times rope.scaling.attn_factor.
Json gguf_yarn(const GgufFile& g, const std::string& a, double factor, int64_t context_length) {
  const double log_mul = meta<double>(g, a + "rope.scaling.yarn_log_multiplier").value_or(0.0);
  const double attention = (log_mul != 0.0 ? yarn_mscale(factor) / yarn_mscale(factor, log_mul) : yarn_mscale(factor)) *
                           meta<double>(g, a + "rope.scaling.attn_factor").value_or(1.0);
  return {{"rope_type", "yarn"},
          {"factor", factor},
          {"original_max_position_embeddings",
           meta<int64_t>(g, a + "rope.scaling.original_context_length").value_or(context_length)},
          {"beta_fast", meta<double>(g, a + "rope.scaling.yarn_beta_fast").value_or(32.0)},
          {"beta_slow", meta<double>(g, a + "rope.scaling.yarn_beta_slow").value_or(1.0)},
          {"attention_factor", attention}};
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  static const char* const kNames[] = {"F32",   "F16",    "Q4_0",    "Q4_1",    "Q4_2",   "Q4_3",  "Q5_0",
                                       "Q5_1",  "Q8_0",   "Q8_1",    "Q2_K",    "Q3_K",   "Q4_K",  "Q5_K",
                                       "Q6_K",  "Q8_K",   "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S", "IQ4_NL",
                                       "IQ3_S", "IQ2_S",  "IQ4_XS",  "I8",      "I16",    "I32",   "I64",
                                       "F64",   "IQ1_M",  "BF16",    "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
                                       "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4", "NVFP4", "Q1_0",
                                       "Q2_0"};
  if (type < std::size(kNames)) return kNames[type];
  return "type " + std::to_string(type);
}

Json gguf_hf_config(const GgufFile& g) {
  const std::string& path = g.file->path();
  const auto arch = meta<std::string>(g, "general.architecture");
  if (!arch) fail(path, ": GGUF has no general.architecture");
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen3")
    fail(path, ": GGUF architecture \"", *arch, "\" is not supported (llama, qwen2, qwen3)");
  const std::string a = *arch + ".";
  auto need = [&](const std::string& key) {
    auto v = meta<double>(g, a + key);
    if (!v) fail(path, ": GGUF has no ", a + key);
    return *v;
  };
  auto integer = [&](const std::string& key) { return static_cast<int64_t>(need(key)); };
  Json c;
  c["model_type"] = *arch;
  c["hidden_size"] = integer("embedding_length");
  if (auto it = g.metadata.find(a + "feed_forward_length"); it != g.metadata.end() && it->is_array())
    fail(path, ": ", a, "feed_forward_length differs per layer, which is not supported");
  c["intermediate_size"] = integer("feed_forward_length");
  c["num_hidden_layers"] = integer("block_count");
  c["num_attention_heads"] = integer("attention.head_count");
  if (auto it = g.metadata.find(a + "attention.head_count_kv"); it != g.metadata.end() && it->is_array())
    fail(path, ": ", a, "attention.head_count_kv differs per layer, which is not supported");
  c["num_key_value_heads"] = meta<int64_t>(g, a + "attention.head_count_kv").value_or(c["num_attention_heads"]);
  c["max_position_embeddings"] = integer("context_length");
  c["rms_norm_eps"] = meta<double>(g, a + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  c["rope_theta"] = meta<double>(g, a + "rope.freq_base").value_or(10000.0);
  const int64_t heads = c["num_attention_heads"];
  const int64_t head_dim = meta<int64_t>(g, a + "attention.key_length").value_or(c["hidden_size"].get<int64_t>() / heads);
  if (meta<int64_t>(g, a + "attention.value_length").value_or(head_dim) != head_dim)
    fail(path, ": attention.value_length differs from attention.key_length, which is not supported");
  c["head_dim"] = head_dim;
  if (auto rot = meta<int64_t>(g, a + "rope.dimension_count"); rot && *rot != head_dim)
    fail(path, ": RoPE over ", *rot, " of ", head_dim, " head dimensions (partial rotary) is not supported");
  const std::string scaling = meta<std::string>(g, a + "rope.scaling.type").value_or("none");
  const double factor = meta<double>(g, a + "rope.scaling.factor").value_or(meta<double>(g, a + "rope.scale_linear").value_or(1.0));
  if (const GgufTensorRecord* ff = find_tensor(g, "rope_freqs.weight")) {
    // Per-pair frequency factors (how llama.cpp's converter writes llama3 scaling).
    if (ff->ggml_type != 0 || ff->dims.size() != 1 || ff->dims[0] != head_dim / 2)
      fail(path, ": rope_freqs.weight must be F32 [", head_dim / 2, "]");
    if (ff->offset > g.file->size() || 4 * static_cast<uint64_t>(ff->dims[0]) > g.file->size() - ff->offset)
      fail(path, ": tensor \"rope_freqs.weight\" lies past the end of the file: truncated?");
    Json factors = Json::array();
    for (int64_t i = 0; i < ff->dims[0]; ++i) {
      float v;
      std::memcpy(&v, g.file->data() + ff->offset + 4 * i, 4);
      factors.push_back(static_cast<double>(v));
    }
    c["rope_scaling"] = {{"rope_type", "freq_factors"}, {"freq_factors", factors}};
    if (scaling != "none" || factor != 1.0) fail(path, ": rope_freqs.weight together with ", a, "rope.scaling.*");
  } else if (scaling == "linear" || (scaling == "none" && factor != 1.0)) {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  } else if (scaling == "yarn") {
    c["rope_scaling"] = gguf_yarn(g, a, factor, c["max_position_embeddings"].get<int64_t>());
  } else if (scaling != "none") {
    fail(path, ": RoPE scaling \"", scaling, "\" is not supported (none, linear, yarn)");
  }
  const int64_t vocab = meta<int64_t>(g, a + "vocab_size").value_or(
      g.metadata.contains("tokenizer.ggml.tokens") ? static_cast<int64_t>(g.metadata["tokenizer.ggml.tokens"].size()) : 0);
  const GgufTensorRecord* embed = find_tensor(g, "token_embd.weight");
  if (!embed || embed->dims.size() != 2) fail(path, ": GGUF has no 2-D token_embd.weight");
  c["vocab_size"] = vocab > 0 ? vocab : embed->dims[1];
  c["tie_word_embeddings"] = find_tensor(g, "output.weight") == nullptr;
  // Biases are optional in llama.cpp's llama graph; the file says whether they are there.
  if (*arch == "llama") {
    const bool qkv = find_tensor(g, "blk.0.attn_q.bias") != nullptr;
    const bool o = find_tensor(g, "blk.0.attn_output.bias") != nullptr;
    if (qkv != o) fail(path, ": llama with a q bias but no o bias (or the reverse) is not supported");
    c["attention_bias"] = qkv;
    c["mlp_bias"] = find_tensor(g, "blk.0.ffn_up.bias") != nullptr;
  }
  if (auto bos = meta<int64_t>(g, "tokenizer.ggml.bos_token_id")) c["bos_token_id"] = *bos;
  Json eos = Json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (auto id = meta<int64_t>(g, key); id && *id >= 0 && std::find(eos.begin(), eos.end(), Json(*id)) == eos.end())
      eos.push_back(*id);
  if (!eos.empty()) c["eos_token_id"] = eos;
  return c;
}

Checkpoint load_gguf_checkpoint(const std::string& path, WeightPlacement placement) {
  const GgufFile g = read_gguf(path);
  Checkpoint ck;
  ck.config = ModelConfig::from_json(gguf_hf_config(g), path);
  const bool permuted = g.metadata.value("general.architecture", "") == "llama";
  TensorMap tensors;
  std::map<DType, int> block_matrices;
  std::map<uint32_t, int> widened;  // legacy GGML type -> tensors rewritten in memory
  for (const auto& r : g.tensors) {
    if (r.name == "rope_freqs.weight") continue;  // in the config (gguf_hf_config)
    if (legacy_type(r.ggml_type)) ++widened[r.ggml_type];
    const std::string name = hf_name(r.name);
    Tensor t = mapped_tensor(g, r);
    const std::string where = path + ": tensor \"" + r.name + "\"";
    if (permuted && name.find("self_attn.q_proj.") != std::string::npos)
      t = unpermute_rope_rows(t, ck.config.num_attention_heads, where);
    if (permuted && name.find("self_attn.k_proj.") != std::string::npos)
      t = unpermute_rope_rows(t, ck.config.num_key_value_heads, where);
    if (is_block_type(t.dtype())) ++block_matrices[t.dtype()];
    tensors.emplace(name, std::move(t));
  }
  // What `astrai info` names: the block type most matrices use (the file may mix types).
  const auto most = std::max_element(block_matrices.begin(), block_matrices.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  if (most != block_matrices.end()) {
    std::string format(dtype_name(most->first));
    std::transform(format.begin(), format.end(), format.begin(), ::tolower);
    ck.config.weight_format = format;
  }
  for (const auto& [type, count] : widened) {
    const auto t = static_cast<LegacyType>(type);
    const bool q8 = t == LegacyType::kQ5_0;
    char ratio[16];
    std::snprintf(ratio, sizeof ratio, "%.1f", (q8 ? 34.0 : 128.0) / static_cast<double>(legacy_block_bytes(t)));
    log_info(path, ": ", count, " ", ggml_type_name(type), " tensors rewritten in memory as ", q8 ? "Q8_0" : "f32", " (",
             ratio, "x their bytes), value for value: there are no kernels for ", ggml_type_name(type), " itself");
  }
  ck.weights = ModelWeights::from_tensors(ck.config, tensors, path);
  if (placement == WeightPlacement::kMemory) {
    ck.weights = ck.weights.copy_to_memory(ck.config);
  } else {
    ck.mapped_bytes = g.file->size();
  }
  return ck;
}

}  // namespace astrai::model
