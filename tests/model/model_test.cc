// Unit tests of the model layer: config parsing and its errors, safetensors round trip and
// header validation, and the forward pass's invariances (paged chunked prefill and decode
// steps, ragged batches, logit_rows) which must hold bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include "../model_families.h"
#include "base/error.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "model/weights.h"

namespace astrai::model {
namespace {

namespace fs = std::filesystem;

Json llama_json() {
  return Json{{"model_type", "llama"},       {"vocab_size", 97},          {"hidden_size", 64},
              {"intermediate_size", 96},     {"num_hidden_layers", 2},    {"num_attention_heads", 8},
              {"num_key_value_heads", 2},    {"rms_norm_eps", 1e-5},      {"max_position_embeddings", 128},
              {"tie_word_embeddings", false}};
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("astrai_model_test_" + std::to_string(::getpid()) + "_" +
                                          std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

// ---------------------------------------------------------------------------- config

TEST(ModelConfig, ParsesFamiliesWithTheirDefaults) {
  ModelConfig c = ModelConfig::from_json(llama_json());
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.kv_groups(), 4);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope_pairing, RopePairing::kHalf);

  Json q2 = llama_json();
  q2["model_type"] = "qwen2";
  c = ModelConfig::from_json(q2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);

  Json q3 = llama_json();
  q3["model_type"] = "qwen3";
  q3["head_dim"] = 32;
  c = ModelConfig::from_json(q3);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qk_norm_after_rope);

  Json own = llama_json();
  own["model_type"] = "transformer";  // the reference's spelling
  own["use_qk_norm"] = true;
  own["use_gated_attention"] = true;
  c = ModelConfig::from_json(own);
  EXPECT_EQ(c.model_type, "autoregressive_lm");
  EXPECT_EQ(c.rope_pairing, RopePairing::kAdjacent);
  EXPECT_TRUE(c.qk_norm_after_rope);
  EXPECT_TRUE(c.gated_attention);

  Json mla = llama_json();
  mla["model_type"] = "autoregressive_lm";
  mla["kv_lora_rank"] = 16;
  mla["qk_nope_head_dim"] = 8;
  mla["qk_rope_head_dim"] = 4;
  c = ModelConfig::from_json(mla);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.qk_head_dim(), 12);
  EXPECT_EQ(c.v_dim(), 8);
  EXPECT_EQ(c.rope_dim(), 4);
}

TEST(ModelConfig, ReferenceAliasesAndRoundTrip) {
  Json j{{"model_type", "autoregressive_lm"}, {"vocab_size", 50}, {"dim", 32}, {"dim_ffn", 64}, {"n_layers", 3},
         {"n_heads", 4}, {"n_kv_heads", 1}, {"norm_eps", 1e-6}, {"max_len", 99}, {"tie_weight", true}};
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.max_position_embeddings, 99);
  EXPECT_TRUE(c.tie_word_embeddings);
  const ModelConfig back = ModelConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(c.to_json()["architectures"], Json::array());  // transformers has no class for it

  // The families' Hugging Face classes, which transformers and llama.cpp's converter pick by.
  for (auto [type, cls] : {std::pair{"llama", "LlamaForCausalLM"}, std::pair{"mistral", "MistralForCausalLM"},
                           std::pair{"qwen2", "Qwen2ForCausalLM"}, std::pair{"qwen3", "Qwen3ForCausalLM"}}) {
    Json fam = llama_json();
    fam["model_type"] = type;
    EXPECT_EQ(ModelConfig::from_json(fam).to_json()["architectures"], Json::array({cls})) << type;
  }

  Json s = llama_json();
  s["rope_scaling"] = Json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  const ModelConfig sc = ModelConfig::from_json(s);
  EXPECT_EQ(ModelConfig::from_json(sc.to_json()).to_json(), sc.to_json());

  // Per-pair frequency factors (GGUF's rope_freqs): one per rotated pair, each dividing its frequency.
  const int64_t half = ModelConfig::from_json(llama_json()).head_dim / 2;
  Json f = llama_json();
  std::vector<double> factors(static_cast<size_t>(half), 1.0);
  factors.back() = 8.0;
  f["rope_scaling"] = Json{{"rope_type", "freq_factors"}, {"freq_factors", factors}};
  const ModelConfig fc = ModelConfig::from_json(f);
  EXPECT_EQ(fc.rope_scaling.type, RopeScalingType::kFreqFactors);
  EXPECT_EQ(ModelConfig::from_json(fc.to_json()).to_json(), fc.to_json());
  const std::vector<double> plain = rope_inv_freq(ModelConfig::from_json(llama_json()), 0);
  const std::vector<double> divided = rope_inv_freq(fc, 0);
  ASSERT_EQ(divided.size(), plain.size());
  EXPECT_EQ(divided.front(), plain.front());
  EXPECT_EQ(static_cast<float>(divided.back()), static_cast<float>(plain.back()) / 8.0f);

  // YaRN: the defaults (betas 32/1, rounded range, attention factor 0.1 ln(factor) + 1) survive
  // the round trip; the fastest pair keeps its frequency, the slowest is divided by the factor.
  Json y = llama_json();
  y["rope_scaling"] = Json{{"rope_type", "yarn"}, {"factor", 4.0}};
  const ModelConfig yc = ModelConfig::from_json(y);
  EXPECT_EQ(yc.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(yc.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(yc.rope_scaling.original_max_position_embeddings, yc.max_position_embeddings);
  EXPECT_DOUBLE_EQ(yc.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(rope_attention_factor(yc), static_cast<float>(0.1 * std::log(4.0) + 1.0));
  EXPECT_EQ(ModelConfig::from_json(yc.to_json()).to_json(), yc.to_json());
  EXPECT_EQ(yc.context_length(), 4 * yc.max_position_embeddings);  // what YaRN extends to
  EXPECT_EQ(ModelConfig::from_json(llama_json()).context_length(), yc.max_position_embeddings);
  const std::vector<double> yarn = rope_inv_freq(yc, 0);
  EXPECT_EQ(yarn.front(), plain.front());
  EXPECT_FLOAT_EQ(static_cast<float>(yarn.back()), static_cast<float>(plain.back() / 4.0));
  y["rope_scaling"]["mscale"] = 0.5;
  y["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(y).rope_scaling.attention_factor,
                   (0.05 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
  y["rope_scaling"]["attention_factor"] = 1.5;  // given: wins over mscale
  EXPECT_EQ(ModelConfig::from_json(y).rope_scaling.attention_factor, 1.5);
  EXPECT_EQ(rope_attention_factor(ModelConfig::from_json(llama_json())), 1.0f);
}

// Quantized checkpoints: the format, and matrices stored in another one (--embedding-type).
TEST(ModelConfig, QuantizationConfigWithTensorFormats) {
  Json j = llama_json();
  j["quantization_config"] = Json{{"quant_method", "astrai"}, {"format", "q4_0"},
                                  {"tensor_formats", {{"model.embed_tokens.weight", "q8_0"}, {"lm_head.weight", "f32"}}}};
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.weight_dtype(), DType::kQ4_0);
  EXPECT_EQ(c.tensor_dtype("model.embed_tokens.weight"), DType::kQ8_0);
  EXPECT_EQ(c.tensor_dtype("lm_head.weight"), DType::kF32);
  EXPECT_EQ(c.tensor_dtype("model.layers.0.mlp.up_proj.weight"), DType::kQ4_0);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_NE(c.summary().find("model.embed_tokens.weight q8_0"), std::string::npos);
  j["quantization_config"]["tensor_formats"]["lm_head.weight"] = "q3_k";
  const std::string e = error_of([&] { ModelConfig::from_json(j, "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: quantization_config.tensor_formats[\"lm_head.weight\"] is \"q3_k\""), std::string::npos)
      << e;
  j["quantization_config"]["tensor_formats"] = "q8_0";
  EXPECT_NE(error_of([&] { ModelConfig::from_json(j); }).find("must be an object"), std::string::npos);
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  auto err = [](Json j) { return error_of([&] { ModelConfig::from_json(j, "x/config.json"); }); };
  Json j = llama_json();
  j.erase("model_type");
  EXPECT_NE(err(j).find("x/config.json: missing required field \"model_type\""), std::string::npos);
  j = llama_json();
  j["model_type"] = "bert";
  EXPECT_NE(err(j).find("unknown model_type \"bert\""), std::string::npos);
  j = llama_json();
  j.erase("vocab_size");
  EXPECT_NE(err(j).find("missing required field \"vocab_size\""), std::string::npos);
  j = llama_json();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(err(j).find("not a multiple"), std::string::npos);
  j = llama_json();
  j["hidden_size"] = "big";
  EXPECT_NE(err(j).find("wrong type"), std::string::npos);
  j = llama_json();
  j["rope_scaling"] = Json{{"rope_type", "linear"}};
  EXPECT_NE(err(j).find("missing required field \"factor\""), std::string::npos);
  j = llama_json();
  j["rope_scaling"] = Json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  EXPECT_NE(err(j).find("original_max_position_embeddings"), std::string::npos);
  j = llama_json();
  j["rope_scaling"] = Json{{"rope_type", "freq_factors"}, {"freq_factors", {1.0, 2.0}}};
  EXPECT_NE(err(j).find("2 RoPE freq_factors for"), std::string::npos);
  j["rope_scaling"] = Json{{"rope_type", "freq_factors"}, {"freq_factors", {1.0, -2.0}}};
  EXPECT_NE(err(j).find("freq_factors must be positive"), std::string::npos);
  j = llama_json();
  j["rope_scaling"] = Json{{"rope_type", "linear"}, {"type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(err(j).find("contradictory"), std::string::npos);
  j["rope_scaling"] = Json{{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", 1.0}, {"beta_slow", 4.0}};
  EXPECT_NE(err(j).find("beta_fast (1) must be greater than beta_slow (4)"), std::string::npos);
  j["rope_scaling"] = Json{{"rope_type", "yarn"}, {"factor", 2.0}, {"attention_factor", -1.0}};
  EXPECT_NE(err(j).find("attention_factor must be a positive number"), std::string::npos);
  j["rope_scaling"] = Json{{"rope_type", "yarn"}, {"factor", 0.5}};
  EXPECT_NE(err(j).find("factor must be >= 1"), std::string::npos);
  j["rope_scaling"] = Json{{"rope_type", "longrope"}, {"factor", 2.0}};
  EXPECT_NE(err(j).find("unsupported rope_type \"longrope\" (supported: default, linear, dynamic, llama3, yarn,"),
            std::string::npos);
  j = llama_json();
  j["model_type"] = "autoregressive_lm";
  j["n_layers"] = 5;
  EXPECT_NE(err(j).find("contradictory fields \"num_hidden_layers\" = 2 and \"n_layers\" = 5"), std::string::npos);
  j["n_layers"] = 2;
  j["qk_rope_head_dim"] = 4;
  EXPECT_NE(err(j).find("needs kv_lora_rank > 0"), std::string::npos);
  j.erase("qk_rope_head_dim");
  j["kv_lora_rank"] = 8;
  EXPECT_NE(err(j).find("missing required field \"qk_nope_head_dim\""), std::string::npos);
  j["qk_nope_head_dim"] = 8;
  j["qk_rope_head_dim"] = 3;
  EXPECT_NE(err(j).find("qk_rope_head_dim must be even"), std::string::npos);
  j = llama_json();
  j["num_attention_heads"] = 0;
  EXPECT_NE(err(j).find("num_attention_heads must be positive"), std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::load("/nonexistent/dir"); }).find("/nonexistent/dir/config.json"),
            std::string::npos);
}

// ---------------------------------------------------------------------------- safetensors

TEST(Safetensors, RoundTripKeepsDtypesShapesAndValues) {
  TempDir dir;
  Tensor a = Tensor::empty({3, 5});
  for (int i = 0; i < 15; ++i) a.data<float>()[i] = 0.25f * static_cast<float>(i) - 1.0f;
  Tensor b = a.to(DType::kBF16).reshape({15});
  Tensor c = a.slice_rows(1, 3).to(DType::kF16);
  Tensor e = Tensor::empty({0, 4});
  write_safetensors(dir.file("t.safetensors"), {{"a", a}, {"b", b}, {"c", c}, {"e", e}}, Json{{"format", "pt"}});
  SafetensorsContents r = read_safetensors(dir.file("t.safetensors"));
  ASSERT_EQ(r.tensors.size(), 4u);
  EXPECT_EQ(r.metadata["format"], "pt");
  EXPECT_TRUE(r.tensors["a"].is_mapped());
  EXPECT_EQ(r.tensors["a"].shape(), (Shape{3, 5}));
  EXPECT_EQ(std::memcmp(r.tensors["a"].raw(), a.raw(), a.nbytes()), 0);
  EXPECT_EQ(r.tensors["b"].dtype(), DType::kBF16);
  EXPECT_EQ(std::memcmp(r.tensors["b"].raw(), b.raw(), b.nbytes()), 0);
  EXPECT_EQ(r.tensors["c"].dtype(), DType::kF16);
  EXPECT_EQ(r.tensors["c"].shape(), (Shape{2, 5}));
  EXPECT_EQ(std::memcmp(r.tensors["c"].raw(), c.raw(), c.nbytes()), 0);
  EXPECT_EQ(r.tensors["e"].numel(), 0);
  EXPECT_FALSE(fs::exists(dir.file("t.safetensors.tmp." + std::to_string(::getpid()))));
}

TEST(Safetensors, WrittenTensorsStartOnCacheLinesWithoutHoles) {
  TempDir dir;
  // An odd-sized tensor first: it moves behind the tensors of whole cache lines.
  Tensor odd = Tensor::empty({3}, DType::kBF16);
  Tensor w = Tensor::empty({4, 16});  // 256 bytes
  Tensor v = Tensor::empty({32}, DType::kBF16);  // 64 bytes
  Tensor f = Tensor::empty({5});  // 20 bytes
  for (Tensor* t : {&odd, &w, &v, &f}) std::memset(t->raw(), 0x3c, t->nbytes());
  write_safetensors(dir.file("a.safetensors"), {{"odd", odd}, {"w", w}, {"v", v}, {"f", f}});
  SafetensorsContents r = read_safetensors(dir.file("a.safetensors"));
  for (const char* name : {"w", "v"}) {
    EXPECT_TRUE(r.tensors[name].is_mapped()) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.tensors[name].raw()) % 64, 0u) << name;
  }
  EXPECT_EQ(std::memcmp(r.tensors["odd"].raw(), odd.raw(), odd.nbytes()), 0);
  EXPECT_EQ(std::memcmp(r.tensors["f"].raw(), f.raw(), f.nbytes()), 0);
  // The data section is exactly the tensors' bytes, back to back.
  std::ifstream in(dir.file("a.safetensors"), std::ios::binary);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(in.get())) << (8 * i);
  EXPECT_EQ((8 + n) % 64, 0u);
  std::string head(n, ' ');
  in.read(head.data(), static_cast<std::streamsize>(n));
  const Json h = Json::parse(head);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto it = h.begin(); it != h.end(); ++it)
    spans.emplace_back(it.value()["data_offsets"][0].get<uint64_t>(), it.value()["data_offsets"][1].get<uint64_t>());
  std::sort(spans.begin(), spans.end());
  uint64_t end = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(8 + n + end, fs::file_size(dir.file("a.safetensors")));
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t len_override = -1) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

TEST(Safetensors, RejectsCorruptHeadersNamingFileAndTensor) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  auto err = [&] { return error_of([&] { read_safetensors(p); }); };
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  EXPECT_EQ(err(), "");
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(err().find(p + ": tensor \"w\": data_offsets [0, 16) are outside the data section"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(err().find("tensor \"w\": shape [2, 3] of F32 needs 24 bytes"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(err().find("tensor \"w\": unsupported dtype \"Q4\""), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(err().find("non-negative"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(err().find("overflows"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", 16);
  EXPECT_NE(err().find("outside the data section"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2]}})", 16);
  EXPECT_NE(err().find("data_offsets"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16, 1ll << 40);
  EXPECT_NE(err().find("exceeds the"), std::string::npos);
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 0, 1000);
  EXPECT_NE(err().find("exceeds the file"), std::string::npos);
  write_raw(p, R"([1,2])", 0);
  EXPECT_NE(err().find("must be a JSON object"), std::string::npos);
  write_raw(p, R"({"w":)", 0);
  EXPECT_NE(err().find("not valid JSON"), std::string::npos);
  { std::ofstream(p, std::ios::binary) << "abc"; }
  EXPECT_NE(err().find("truncated safetensors file"), std::string::npos);
  EXPECT_NE(error_of([&] { read_safetensors(dir.file("none.safetensors")); }).find("cannot open"), std::string::npos);
}

TEST(Safetensors, MisalignedTensorsAreCopiedOut) {
  TempDir dir;
  const std::string p = dir.file("odd.safetensors");
  // A u8 tensor of 1 byte pushes the f32 tensor to an odd offset.
  std::string header = R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  std::ofstream out(p, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  out.put(7);
  const float vals[2] = {1.5f, -2.0f};
  out.write(reinterpret_cast<const char*>(vals), sizeof vals);
  out.close();
  SafetensorsContents r = read_safetensors(p);
  const Tensor& w = r.tensors["w"];
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.raw()) % 4, 0u);
  EXPECT_EQ(w.data<float>()[0], 1.5f);
  EXPECT_EQ(w.data<float>()[1], -2.0f);
}

// ---------------------------------------------------------------------------- forward

ModelWeights random_weights(const ModelConfig& c, uint32_t seed) { return testing_util::random_weights(c, seed); }

Json mla_json() { return testing_util::with_mla(llama_json()); }

struct PagedCache {
  std::vector<std::vector<float>> k, v;  // f32, or bf16 pairs for DType::kBF16
  PagedKv kv;
  PagedCache(const Transformer& m, int32_t page_size, int32_t pages, DType dtype = DType::kF32) {
    kv = m.kv_geometry(page_size, dtype);
    const int64_t layers = m.config().num_hidden_layers;
    const size_t per_float = 4 / dtype_size(dtype);
    k.resize(layers);
    v.resize(layers);
    for (int64_t l = 0; l < layers; ++l) {
      k[l].assign(static_cast<size_t>(pages) * page_size * kv.num_kv_heads * kv.k_head_dim / per_float, NAN);
      v[l].assign(static_cast<size_t>(pages) * page_size * kv.num_kv_heads * kv.v_head_dim / per_float, NAN);
      kv.k_pages.push_back(k[l].data());
      kv.v_pages.push_back(v[l].data());
    }
  }
};

std::vector<float> forward_alone(const Transformer& m, const std::vector<int32_t>& ids) {
  Batch b;
  b.add_sequence(ids);
  ForwardWorkspace ws;
  std::vector<float> out(ids.size() * static_cast<size_t>(m.vocab_size()));
  m.forward(b, nullptr, ws, out.data());
  return out;
}

void check_chunked_prefill(const Transformer& m, DType dtype);

class ForwardInvariance : public ::testing::TestWithParam<const char*> {
 protected:
  Transformer make() const {
    const std::string kind = GetParam();
    Json j = kind == std::string("mla") ? mla_json() : llama_json();
    if (kind == std::string("qwen3")) {
      j["model_type"] = "qwen3";
      j["head_dim"] = 16;
    }
    ModelConfig c = ModelConfig::from_json(j);
    return Transformer(c, random_weights(c, 7));
  }
};

// Logits of one sequence prefilled in one step through a fresh paged cache of `dtype`.
std::vector<float> paged_alone(const Transformer& m, const std::vector<int32_t>& ids, DType dtype) {
  PagedCache cache(m, 4, 16, dtype);
  std::vector<int32_t> table;
  for (size_t p = 0; p * 4 < ids.size(); ++p) table.push_back(static_cast<int32_t>(15 - p));
  Batch b;
  b.add_sequence(ids, 0, table);
  ForwardWorkspace ws;
  std::vector<float> out(ids.size() * static_cast<size_t>(m.vocab_size()));
  m.forward(b, &cache.kv, ws, out.data());
  return out;
}

// f32 cache: every chunking equals the forward without a cache, bit for bit. bf16 cache: every
// chunking equals the whole prefill through a bf16 cache (attention always reads the rounded
// K/V), and stays close to f32.
TEST_P(ForwardInvariance, PagedChunkedPrefillAndDecodeAreBitIdentical) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    check_chunked_prefill(make(), dtype);
  }
}

TEST_P(ForwardInvariance, Bf16CacheStaysCloseToF32) {
  const Transformer m = make();
  const std::vector<int32_t> ids = {5, 9, 1, 44, 2, 2, 17, 90, 3, 3, 60, 12, 8, 8, 31, 77, 4, 0, 96, 23};
  const auto f32 = forward_alone(m, ids), bf16 = paged_alone(m, ids, DType::kBF16);
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(f32[i]));
    max_diff = std::max(max_diff, std::fabs(f32[i] - bf16[i]));
  }
  EXPECT_GT(max_diff, 0.0f);
  EXPECT_LT(max_diff / max_ref, 0.02f);
}

void check_chunked_prefill(const Transformer& m, DType dtype) {
  const int64_t vocab = m.vocab_size();
  std::vector<std::vector<int32_t>> seqs = {{5, 9, 1, 44, 2, 2, 17, 90, 3, 3, 60, 12, 8, 8, 31, 77, 4, 0, 96, 23},
                                            {11, 12, 13}, {50, 40, 30, 20, 10, 1, 2}};
  std::vector<std::vector<float>> want;
  for (const auto& s : seqs) want.push_back(dtype == DType::kF32 ? forward_alone(m, s) : paged_alone(m, s, dtype));

  // Pages interleaved between sequences and out of order; page size 4.
  PagedCache cache(m, 4, 16, dtype);
  std::vector<std::vector<int32_t>> tables = {{9, 2, 14, 0, 6}, {1}, {15, 3}};
  ForwardWorkspace ws;  // reused for every step, with steps of different shapes
  std::vector<size_t> done(seqs.size(), 0);
  const size_t chunk_plan[] = {3, 1, 6, 1, 1, 5, 1, 1, 1, 1, 1};
  for (size_t step = 0; step < std::size(chunk_plan); ++step) {
    Batch b;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (done[i] >= seqs[i].size()) continue;
      const size_t n = std::min(chunk_plan[step] + i, seqs[i].size() - done[i]);
      b.add_sequence(std::vector<int32_t>(seqs[i].begin() + done[i], seqs[i].begin() + done[i] + n),
                     static_cast<int32_t>(done[i]), tables[i]);
      which.push_back(i);
    }
    if (which.empty()) break;
    std::vector<float> logits(static_cast<size_t>(b.num_tokens() * vocab));
    m.forward(b, &cache.kv, ws, logits.data());
    for (size_t r = 0; r < which.size(); ++r) {
      const size_t i = which[r];
      const SeqSpan& sp = b.seqs[r];
      for (int32_t j = 0; j < sp.num_tokens; ++j) {
        const float* got = logits.data() + (sp.token_begin + j) * vocab;
        const float* exp = want[i].data() + (done[i] + j) * vocab;
        ASSERT_EQ(std::memcmp(got, exp, vocab * sizeof(float)), 0)
            << "sequence " << i << " position " << done[i] + j << " step " << step;
      }
      done[i] += static_cast<size_t>(sp.num_tokens);
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(done[i], seqs[i].size());
}

TEST_P(ForwardInvariance, RaggedBatchAndLogitRowsMatchEachSequenceAlone) {
  const Transformer m = make();
  const int64_t vocab = m.vocab_size();
  std::vector<std::vector<int32_t>> seqs = {{3, 1, 4, 1, 5, 9, 2, 6, 5}, {2, 7}, {1}, {8, 2, 8, 1, 8, 2, 8}};
  Batch b;
  for (const auto& s : seqs) b.add_sequence(s);
  ForwardWorkspace ws;
  std::vector<float> all(static_cast<size_t>(b.num_tokens() * vocab));
  m.forward(b, nullptr, ws, all.data());
  int64_t row = 0;
  for (const auto& s : seqs) {
    const std::vector<float> alone = forward_alone(m, s);
    EXPECT_EQ(std::memcmp(all.data() + row * vocab, alone.data(), alone.size() * sizeof(float)), 0);
    row += static_cast<int64_t>(s.size());
  }
  // Only the last row of each sequence (what decoding asks for), plus a repeat.
  b.logit_rows = {8, 10, 11, 18, 8};
  std::vector<float> some(b.logit_rows.size() * static_cast<size_t>(vocab));
  m.forward(b, nullptr, ws, some.data());
  for (size_t r = 0; r < b.logit_rows.size(); ++r)
    EXPECT_EQ(std::memcmp(some.data() + r * vocab, all.data() + b.logit_rows[r] * vocab, vocab * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, ForwardInvariance, ::testing::Values("llama", "qwen3", "mla"));

TEST(Transformer, SaveAndLoadGiveTheSameLogits) {
  TempDir dir;
  const ModelConfig c = ModelConfig::from_json(mla_json());
  const Transformer owned(c, random_weights(c, 3));
  save_checkpoint(dir.str(), c, owned.weights());
  const Transformer loaded = Transformer::load(dir.str());
  EXPECT_EQ(loaded.mapped_bytes(), loaded.weight_bytes());
  EXPECT_EQ(loaded.num_parameters(), owned.num_parameters());
  const std::vector<int32_t> ids = {1, 2, 3, 50, 96};
  EXPECT_EQ(forward_alone(owned, ids), forward_alone(loaded, ids));

  // bf16 copy: logits close to the f32 model's (weights rounded to 8 bits of mantissa).
  TempDir dir16;
  save_checkpoint(dir16.str(), c, owned.weights(), DType::kBF16);
  const Transformer half = Transformer::load(dir16.str());
  EXPECT_EQ(half.weight_bytes() * 2, owned.weight_bytes());
  const auto a = forward_alone(owned, ids), b = forward_alone(half, ids);
  float max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(a[i]));
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  }
  EXPECT_LT(max_diff / max_ref, 0.05f);
  EXPECT_GT(max_diff, 0.0f);
}

// --no-mmap: the same checkpoint copied into one owned block gives the same tensors (bytes,
// dtypes) and the same logits bit for bit, with nothing left mapped.
TEST(Transformer, LoadIntoMemoryEqualsTheMappedLoad) {
  for (const char* family : {"llama", "mla"}) {
    const ModelConfig c = ModelConfig::from_json(std::string(family) == "mla" ? mla_json() : llama_json());
    const Transformer owned(c, random_weights(c, 4));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(family) + " " + std::string(dtype_name(dtype)));
      TempDir dir;
      save_checkpoint(dir.str(), c, owned.weights(), dtype);
      const Transformer mapped = Transformer::load(dir.str());
      const Transformer copied = Transformer::load(dir.str(), WeightPlacement::kMemory);
      EXPECT_EQ(copied.mapped_bytes(), 0u);
      EXPECT_EQ(copied.weight_bytes(), mapped.weight_bytes());
      const auto a = mapped.weights().params(c), b = copied.weights().params(c);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_FALSE(b[i].tensor->is_mapped()) << b[i].name;
        EXPECT_EQ(b[i].tensor->dtype(), a[i].tensor->dtype()) << b[i].name;
        EXPECT_EQ(b[i].tensor->shape(), a[i].tensor->shape()) << b[i].name;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(b[i].tensor->raw()) % 64, 0u) << b[i].name;
        EXPECT_EQ(std::memcmp(a[i].tensor->raw(), b[i].tensor->raw(), a[i].tensor->nbytes()), 0) << b[i].name;
      }
      const std::vector<int32_t> ids = {1, 2, 3, 50, 96};
      const auto la = forward_alone(mapped, ids), lb = forward_alone(copied, ids);
      EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
    }
  }
}

TEST(ModelWeights, CopyToMemoryKeepsATiedHeadShared) {
  Json j = llama_json();
  j["tie_word_embeddings"] = true;
  const ModelConfig c = ModelConfig::from_json(j);
  const ModelWeights w = random_weights(c, 6).copy_to_memory(c);
  EXPECT_EQ(w.lm_head.raw(), w.embed_tokens.raw());
}

// allocate(): every parameter zero-filled, 64-byte aligned, and none overlapping another.
TEST(ModelWeights, AllocatePlacesEveryParameterApart) {
  const ModelConfig c = ModelConfig::from_json(mla_json());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ModelWeights w = ModelWeights::allocate(c, dtype);
    std::vector<std::pair<uintptr_t, uintptr_t>> spans;
    for (const auto& p : w.params(c)) {
      ASSERT_TRUE(p.tensor->defined()) << p.name;
      EXPECT_EQ(p.tensor->shape(), p.shape) << p.name;
      EXPECT_EQ(p.tensor->dtype(), dtype) << p.name;
      const auto* bytes = static_cast<const uint8_t*>(p.tensor->raw());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % 64, 0u) << p.name;
      EXPECT_TRUE(std::all_of(bytes, bytes + p.tensor->nbytes(), [](uint8_t b) { return b == 0; })) << p.name;
      spans.emplace_back(reinterpret_cast<uintptr_t>(bytes), reinterpret_cast<uintptr_t>(bytes) + p.tensor->nbytes());
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  }
}

TEST(Transformer, TrainerUpdatesToOwnedWeightsAreSeen) {
  const ModelConfig c = ModelConfig::from_json(llama_json());
  ModelWeights w = random_weights(c, 5);
  Tensor norm = w.layers[0].input_layernorm;  // shares storage with the model's copy
  const Transformer m(c, w);
  const auto before = forward_alone(m, {1, 2, 3});
  norm.data<float>()[0] += 1.0f;
  EXPECT_NE(before, forward_alone(m, {1, 2, 3}));
}

TEST(Transformer, RejectsBadBatchesAndWeights) {
  const ModelConfig c = ModelConfig::from_json(llama_json());
  const Transformer m(c, random_weights(c, 1));
  ForwardWorkspace ws;
  std::vector<float> out(1000 * 97);
  auto err = [&](const Batch& b, const PagedKv* kv = nullptr) {
    return error_of([&] { m.forward(b, kv, ws, out.data()); });
  };
  Batch b;
  b.add_sequence({1, 97});
  EXPECT_NE(err(b).find("token id 97 at batch row 1 is outside the vocabulary [0, 97)"), std::string::npos);
  b = Batch();
  b.add_sequence({1, 2}, 3);
  EXPECT_NE(err(b).find("without a KV cache"), std::string::npos);
  PagedCache cache(m, 4, 4);
  b = Batch();
  b.add_sequence({1, 2, 3}, 3, {0});
  EXPECT_NE(err(b, &cache.kv).find("needs 2 pages"), std::string::npos);
  b = Batch();
  b.add_sequence({1, 2});
  b.seqs[0].num_tokens = 1;
  EXPECT_NE(err(b).find("cover 1 of 2 tokens"), std::string::npos);
  b = Batch();
  b.add_sequence({1, 2});
  b.logit_rows = {2};
  EXPECT_NE(err(b).find("logit row 2"), std::string::npos);
  PagedKv wrong = cache.kv;
  wrong.k_head_dim = 4;
  b = Batch();
  b.add_sequence({1}, 0, {0});
  EXPECT_NE(err(b, &wrong).find("does not match the model"), std::string::npos);
  wrong = cache.kv;
  wrong.dtype = DType::kF16;
  EXPECT_NE(err(b, &wrong).find("elements must be F32 or BF16, not F16"), std::string::npos);

  ModelWeights w = random_weights(c, 1);
  w.layers[1].up_proj = Tensor::empty({96, 63});
  EXPECT_NE(error_of([&] { Transformer(c, w); }).find("\"model.layers.1.mlp.up_proj.weight\" has shape [96, 63]"),
            std::string::npos);
}

TEST(RopeInvFreq, ScalingsFollowHuggingFace) {
  Json j = llama_json();  // head_dim 8, theta 10000
  const auto plain = rope_inv_freq(ModelConfig::from_json(j), 1);
  ASSERT_EQ(plain.size(), 4u);
  EXPECT_FLOAT_EQ(static_cast<float>(plain[1]), 0.1f);  // 10000^(-2/8)
  j["rope_scaling"] = Json{{"type", "linear"}, {"factor", 4.0}};
  EXPECT_FLOAT_EQ(static_cast<float>(rope_inv_freq(ModelConfig::from_json(j), 1)[1]), 0.025f);
  j["rope_scaling"] = Json{{"rope_type", "dynamic"}, {"factor", 2.0}};
  const ModelConfig dyn = ModelConfig::from_json(j);
  EXPECT_EQ(rope_inv_freq(dyn, 128), plain);  // within the original context: unchanged
  const double base = 10000.0 * std::pow(2.0 * 256 / 128 - 1.0, 8.0 / 6.0);
  EXPECT_NEAR(rope_inv_freq(dyn, 256)[1], std::pow(base, -0.25), 1e-7);
}

}  // namespace
}  // namespace astrai::model
