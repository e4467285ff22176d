#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "model/gguf_checkpoint.h"

namespace astrai::model {

namespace {

// The parameter list (model/param_schema.h) with pointers to the slots of `w`.
template <typename P>
std::vector<P> list_params(const ModelConfig& c, ModelWeights& w) {
  std::vector<P> out;
  for_each_param(c, w, [&](const ParamInfo& info, Tensor& slot) { out.push_back(P{info.name, info.shape, &slot}); });
  return out;
}

// The reference AstrAI spelling of a Hugging Face name: no "model." prefix,
// "self_attn." -> "attention.", input_norm / post_attention_norm.
std::string reference_name(const std::string& hf) {
  std::string n = hf.rfind("model.", 0) == 0 ? hf.substr(6) : hf;
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t pos = n.find(from);
    if (pos != std::string::npos) n.replace(pos, from.size(), to);
  };
  replace("self_attn.", "attention.");
  replace("input_layernorm.", "input_norm.");
  replace("post_attention_layernorm.", "post_attention_norm.");
  return n;
}

}  // namespace

std::vector<ModelWeights::Param> ModelWeights::params(const ModelConfig& config) {
  return list_params<Param>(config, *this);
}

std::vector<ModelWeights::ConstParam> ModelWeights::params(const ModelConfig& config) const {
  // layers is sized by the mutable overload; here it must already match the config.
  ASTRAI_CHECK(static_cast<int64_t>(layers.size()) == config.num_hidden_layers,
               "weights hold ", layers.size(), " layers but the config has ", config.num_hidden_layers);
  auto& self = const_cast<ModelWeights&>(*this);
  std::vector<ConstParam> out;
  for (auto& p : list_params<Param>(config, self)) out.push_back(ConstParam{p.name, p.shape, p.tensor});
  return out;
}

namespace {

// A Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K matrix as `astrai quantize` stores it: U8 [rows, cols / block * block
// bytes], each row's blocks in order (docs/quantization.md); read in place as a tensor of the
// expected shape.
Tensor block_matrix(const Tensor& t, DType dtype, const Shape& expected, const std::string& name,
                    const std::string& where) {
  const bool matrix = expected.size() == 2 && expected[1] % block_elems(dtype) == 0;
  const int64_t bytes = matrix ? static_cast<int64_t>(dtype_bytes(dtype, expected[1])) : 0;
  if (!matrix || t.ndim() != 2 || t.dim(0) != expected[0] || t.dim(1) != bytes)
    fail(where, ": tensor \"", name, "\" is U8 ", shape_str(t.shape()), ", not ", dtype_name(dtype), " blocks of ",
         shape_str(expected), matrix ? str_cat(" (U8 [", expected[0], ", ", bytes, "])") : "");
  return t.view_as(dtype, expected);
}

}  // namespace

ModelWeights ModelWeights::from_tensors(const ModelConfig& config, const TensorMap& tensors, const std::string& where) {
  ModelWeights w;
  const bool own = config.model_type == "autoregressive_lm";
  std::set<std::string> used;
  for (auto& p : w.params(config)) {
    auto it = tensors.find(p.name);
    std::string name = p.name;
    if (it == tensors.end() && own) {
      name = reference_name(p.name);
      it = tensors.find(name);
    }
    if (it == tensors.end()) fail(where, ": missing tensor \"", p.name, "\"");
    Tensor t = it->second;
    const DType blocks = config.tensor_dtype(p.name);  // kF32 for a float checkpoint
    const bool quantized = is_block_type(blocks);
    if (t.dtype() == DType::kU8 && quantized) t = block_matrix(t, blocks, p.shape, name, where);
    // A GGUF file's matrices carry their own block type, one per tensor (model/gguf_checkpoint.h).
    const bool typed_blocks = is_block_type(t.dtype()) && p.shape.size() == 2;
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16 && t.dtype() != blocks &&
        !typed_blocks)
      fail(where, ": tensor \"", name, "\" has unsupported dtype ", dtype_name(t.dtype()), " (need F32, BF16 or F16",
           quantized ? str_cat("; ", dtype_name(blocks), " matrices are U8 [rows, cols / ", block_elems(blocks), " * ",
                               block_bytes(blocks), "]")
                     : std::string(), ")");
    if (t.shape() != p.shape)
      fail(where, ": tensor \"", name, "\" has shape ", shape_str(t.shape()), ", expected ", shape_str(p.shape));
    *p.tensor = t;
    used.insert(name);
  }
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    used.insert("lm_head.weight");  // checkpoints of tied models sometimes carry a copy
  }
  size_t unused = 0;
  std::string example;
  for (const auto& [name, t] : tensors) {
    if (used.count(name) || name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (unused++ == 0) example = name;
  }
  if (unused > 0) log_warn(where, ": ignoring ", unused, " tensor(s) this architecture does not use, e.g. \"", example, "\"");
  return w;
}

namespace {

// Fills every parameter slot of `w` with a view into one new owned block (huge pages once it
// is 4 MiB or more, tensor/tensor.h), each starting on a 64-byte boundary: parameter i gets
// its shape and dtype_of(i).
template <typename DTypeOf>
void place_in_one_block(const ModelConfig& config, ModelWeights& w, DTypeOf&& dtype_of) {
  auto params = w.params(config);
  std::vector<size_t> offset{0};
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t bytes = dtype_bytes(dtype_of(i), shape_numel(params[i].shape));
    offset.push_back(offset.back() + (bytes + 63) / 64 * 64);
  }
  auto storage = make_host_storage(offset.back());
  for (size_t i = 0; i < params.size(); ++i)
    *params[i].tensor = Tensor(storage, offset[i], params[i].shape, dtype_of(i));
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
}

}  // namespace

ModelWeights ModelWeights::allocate(const ModelConfig& config, DType dtype) {
  ModelWeights w;
  place_in_one_block(config, w, [dtype](size_t) { return dtype; });
  return w;
}

ModelWeights ModelWeights::copy_to_memory(const ModelConfig& config) const {
  const auto src = params(config);
  for (const auto& p : src)
    ASTRAI_CHECK(p.tensor->defined() && p.tensor->shape() == p.shape, "model weights: parameter \"", p.name,
                 "\" is not set or has the wrong shape");
  ModelWeights w;
  place_in_one_block(config, w, [&src](size_t i) { return src[i].tensor->dtype(); });
  const auto dst = w.params(config);
  // Pieces of at most 4 MiB so both threads share even one large tensor (the embedding).
  struct Piece {
    const uint8_t* from;
    uint8_t* to;
    size_t bytes;
  };
  std::vector<Piece> pieces;
  constexpr size_t kPiece = size_t{4} << 20;
  for (size_t i = 0; i < src.size(); ++i) {
    const auto* from = static_cast<const uint8_t*>(src[i].tensor->raw());
    auto* to = static_cast<uint8_t*>(dst[i].tensor->raw());
    for (size_t at = 0, n = src[i].tensor->nbytes(); at < n; at += kPiece)
      pieces.push_back({from + at, to + at, std::min(kPiece, n - at)});
  }
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < pieces.size(); ++i) std::memcpy(pieces[i].to, pieces[i].from, pieces[i].bytes);
  return w;
}

int64_t ModelWeights::num_parameters(const ModelConfig& config) const {
  int64_t n = 0;
  for (const auto& p : params(config)) n += shape_numel(p.shape);
  return n;
}

size_t ModelWeights::bytes(const ModelConfig& config) const {
  size_t n = 0;
  for (const auto& p : params(config)) n += p.tensor->nbytes();
  return n;
}

Checkpoint load_checkpoint(const std::string& dir, WeightPlacement placement) {
  if (is_gguf_file(dir)) return load_gguf_checkpoint(dir, placement);
  Checkpoint ck;
  ck.config = ModelConfig::load(dir);
  SafetensorsContents contents = read_checkpoint_tensors(dir);
  ck.weights = ModelWeights::from_tensors(ck.config, contents.tensors, dir);
  if (placement == WeightPlacement::kMemory) {
    ck.weights = ck.weights.copy_to_memory(ck.config);  // the mapping closes with `contents`
  } else {
    ck.mapped_bytes = contents.mapped_bytes;
  }
  return ck;
}

void save_checkpoint(const std::string& dir, const ModelConfig& config, const ModelWeights& weights, DType dtype) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory ", dir, ": ", ec.message());
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : weights.params(config)) {
    const Tensor& t = *p.tensor;
    ASTRAI_CHECK(t.defined(), dir, ": parameter \"", p.name, "\" is not set");
    ASTRAI_CHECK(t.shape() == p.shape, dir, ": parameter \"", p.name, "\" has shape ", shape_str(t.shape()),
                 ", expected ", shape_str(p.shape));
    out.emplace_back(p.name, t.dtype() == dtype ? t : t.to(dtype));
  }
  write_safetensors(dir + "/model.safetensors", out, Json{{"format", "pt"}});
  ModelConfig written = config;
  written.weight_format.clear();  // float tensors (quantized ones are widened by to(dtype))
  written.tensor_formats.clear();
  write_file_atomic(dir + "/config.json", written.to_json().dump(2) + "\n");
}

}  // namespace astrai::model
