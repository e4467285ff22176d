#include "tokenizer/tokenizer.h"

#include "base/gguf_file.h"
#include "tokenizer/gguf_vocab.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "base/files.h"
#include "base/gguf_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace astrai::tokenizer {

namespace {

// Finds added tokens in text like HF's AddedVocabulary::find_matches: leftmost-longest
// non-overlapping matches (aho-corasick semantics), then the single_word / lstrip /
// rstrip rules. Tokens are bucketed by first byte, longest first.
class AddedMatcher {
 public:
  void add(std::string pattern, int32_t token_index) {
    if (pattern.empty()) return;
    entries_.push_back({std::move(pattern), token_index});
  }
  void finish() {
    std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
      if (a.pattern[0] != b.pattern[0]) return uint8_t(a.pattern[0]) < uint8_t(b.pattern[0]);
      return a.pattern.size() > b.pattern.size();
    });
    first_.fill({0, 0});
    for (size_t i = 0; i < entries_.size(); ++i) {
      auto& r = first_[uint8_t(entries_[i].pattern[0])];
      if (r.second == 0) r.first = uint32_t(i);
      r.second = uint32_t(i + 1);
    }
  }
  bool empty() const { return entries_.empty(); }

  struct Split {
    uint32_t start, end;
    int32_t token;  // index into added tokens, -1 for text
  };
  void find(std::string_view s, const std::vector<AddedToken>& tokens, std::vector<Split>& out) const {
    out.clear();
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < s.size()) {
      auto [lo, hi] = first_[uint8_t(s[pos])];
      const Entry* hit = nullptr;
      for (uint32_t k = lo; k < hi; ++k) {
        const std::string& p = entries_[k].pattern;
        if (s.size() - pos >= p.size() && s.compare(pos, p.size(), p) == 0) {
          hit = &entries_[k];
          break;
        }
      }
      if (!hit) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + hit->pattern.size();
      pos = stop;  // the automaton resumes after the match, used or not
      const AddedToken& t = tokens[hit->token];
      if (t.single_word) {
        bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
        bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t p;
          if (!is_white_space(utf8_prev(s, b, &p))) break;
          b = p;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t i = stop;
          if (!is_white_space(utf8_next(s, i))) break;
          stop = i;
        }
      }
      if (start_offset < start) out.push_back({uint32_t(start_offset), uint32_t(start), -1});
      out.push_back({uint32_t(start), uint32_t(stop), hit->token});
      start_offset = stop;
      pos = std::max(pos, stop);
    }
    if (start_offset != s.size()) out.push_back({uint32_t(start_offset), uint32_t(s.size()), -1});
  }

 private:
  static bool ends_with_word(std::string_view s) {
    return !s.empty() && is_word_char(utf8_prev(s, s.size(), nullptr));
  }
  static bool starts_with_word(std::string_view s) {
    size_t i = 0;
    return !s.empty() && is_word_char(utf8_next(s, i));
  }
  struct Entry {
    std::string pattern;
    int32_t token;
  };
  std::vector<Entry> entries_;
  std::array<std::pair<uint32_t, uint32_t>, 256> first_{};
};

std::string token_content(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("tokenizer_config.json: \"", key, "\" must be a string or an object with \"content\"");
}

}  // namespace

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<Bpe> model;
  Decoder decoder;
  PostProcessor post_processor;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  Vocab added_by_content;
  AddedMatcher raw_matcher, normalized_matcher;
  size_t vocab_size = 0;
  Json config;
  std::string bos, eos, pad, unk;
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  std::string chat_template;
  std::vector<std::pair<std::string, std::string>> named_templates;

  std::optional<int32_t> token_to_id(std::string_view t) const {
    auto it = added_by_content.find(t);
    if (it != added_by_content.end()) return it->second;
    return model->token_to_id(t);
  }

  void encode_segment(std::string_view seg, bool first, std::vector<int32_t>& ids) const {
    thread_local Pieces pieces;
    thread_local std::vector<AddedMatcher::Split> splits;
    std::string normalized;
    std::string_view text = seg;
    if (!normalizer.identity()) {
      normalized = normalizer.apply(seg);
      text = normalized;
    }
    std::vector<AddedMatcher::Split> local;
    if (!normalized_matcher.empty()) {
      normalized_matcher.find(text, added, local);
    } else if (!text.empty()) {
      local.push_back({0, uint32_t(text.size()), -1});
    }
    for (const auto& sp : local) {
      if (sp.token >= 0) {
        ids.push_back(added[sp.token].id);
        continue;
      }
      pre_tokenizer.apply(text.substr(sp.start, sp.end - sp.start), first && sp.start == 0, pieces);
      for (auto [a, b] : pieces.ranges) model->tokenize(std::string_view(pieces.buf).substr(a, b - a), ids);
    }
    (void)splits;
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json(const Json& j, const Json& config) {
  try {
    return from_json_checked(j, config);
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected JSON type deep in the file.
    fail("tokenizer.json: malformed (", e.what(), ")");
  }
}

Tokenizer Tokenizer::from_json_checked(const Json& j, const Json& config) {
  const std::string where = "tokenizer.json";
  if (!j.is_object()) fail(where, ": not a JSON object");
  auto impl = std::make_shared<Impl>();
  impl->normalizer = Normalizer(j.value("normalizer", Json()));
  impl->pre_tokenizer = PreTokenizer(j.value("pre_tokenizer", Json()));
  if (!j.contains("model")) fail(where, ": missing \"model\"");
  impl->model = std::make_unique<Bpe>(j["model"], impl->pre_tokenizer.byte_level());
  impl->decoder = Decoder(j.value("decoder", Json()));
  impl->vocab_size = impl->model->vocab_size() ? size_t(impl->model->max_id() + 1) : 0;

  for (const Json& t : j.value("added_tokens", Json::array())) {
    AddedToken a;
    a.id = json_required<int32_t>(t, "id", where + " added_tokens");
    a.content = json_required<std::string>(t, "content", where + " added_tokens");
    a.special = json_optional<bool>(t, "special", false, where);
    a.single_word = json_optional<bool>(t, "single_word", false, where);
    a.lstrip = json_optional<bool>(t, "lstrip", false, where);
    a.rstrip = json_optional<bool>(t, "rstrip", false, where);
    a.normalized = json_optional<bool>(t, "normalized", !a.special, where);
    if (a.id < 0) fail(where, ": added token \"", a.content, "\" has a negative id");
    // HF re-derives ids while adding (AddedVocabulary::add_tokens) and only warns when
    // they differ from the file: the model's id if the model has the content, the id of
    // an earlier identical added token, else the next id after the added ones (or the
    // model size). For consistent files this is the id written in the file.
    if (a.content.empty()) continue;
    if (auto model_id = impl->model->token_to_id(a.content)) {
      a.id = *model_id;
    } else if (auto prev = impl->added_by_content.find(a.content); prev != impl->added_by_content.end()) {
      a.id = prev->second;
    } else {
      int64_t model_size = int64_t(impl->model->entries());
      int64_t max_added = -1;
      for (const auto& [c, id] : impl->added_by_content) max_added = std::max<int64_t>(max_added, id);
      a.id = int32_t((max_added >= 0 && (max_added >= model_size || model_size == 0)) ? max_added + 1 : model_size);
    }
    if (utf8_invalid_offset(a.content) != std::string::npos) fail(where, ": added token content is not UTF-8");
    impl->added_by_id[a.id] = impl->added.size();
    impl->added_by_content[a.content] = a.id;
    impl->vocab_size = std::max(impl->vocab_size, size_t(a.id) + 1);
    impl->added.push_back(std::move(a));
  }
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& a = impl->added[i];
    if (a.normalized) impl->normalized_matcher.add(impl->normalizer.apply(a.content), int32_t(i));
    else impl->raw_matcher.add(a.content, int32_t(i));
  }
  impl->raw_matcher.finish();
  impl->normalized_matcher.finish();
  const Impl* raw = impl.get();
  impl->post_processor = PostProcessor(j.value("post_processor", Json()),
                                       [raw](const std::string& t) { return raw->token_to_id(t); });

  impl->config = config;
  if (config.is_object()) {
    impl->bos = token_content(config, "bos_token");
    impl->eos = token_content(config, "eos_token");
    impl->pad = token_content(config, "pad_token");
    impl->unk = token_content(config, "unk_token");
    auto id_of = [&](const std::string& t) -> int32_t {
      if (t.empty()) return -1;
      auto id = impl->token_to_id(t);
      if (!id) fail("tokenizer_config.json: special token \"", t, "\" is not in the vocabulary");
      return *id;
    };
    impl->bos_id = id_of(impl->bos);
    impl->eos_id = id_of(impl->eos);
    impl->pad_id = id_of(impl->pad);
    impl->unk_id = id_of(impl->unk);
    auto ct = config.find("chat_template");
    if (ct != config.end() && ct->is_string()) {
      impl->chat_template = ct->get<std::string>();
    } else if (ct != config.end() && ct->is_array()) {
      for (const Json& t : *ct) {
        std::string name = json_required<std::string>(t, "name", "tokenizer_config.json chat_template");
        std::string tpl = json_required<std::string>(t, "template", "tokenizer_config.json chat_template");
        if (name == "default") impl->chat_template = tpl;
        impl->named_templates.emplace_back(std::move(name), std::move(tpl));
      }
    }
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  if (is_gguf_file(path)) {  // the vocabulary in a GGUF model file's metadata
    const Json meta = read_gguf(path).metadata;
    try {
      return from_json(gguf_tokenizer_json(meta, path), gguf_tokenizer_config(meta, path));
    } catch (const Error& e) {
      fail(path, ": ", e.what());
    }
  }
  fs::path p(path);
  fs::path dir = p, file = p / "tokenizer.json";
  if (!fs::is_directory(p)) {
    file = p;
    dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  }
  if (!fs::exists(file)) fail("tokenizer: ", file.string(), " does not exist");
  Json j = read_json_file(file.string());
  Json config;
  fs::path cfg = dir / "tokenizer_config.json";
  if (fs::exists(cfg)) config = read_json_file(cfg.string());
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja)) {
    if (!config.is_object()) config = Json::object();
    if (!config.contains("chat_template")) config["chat_template"] = read_file(jinja.string());
  }
  try {
    return from_json(j, config);
  } catch (const Error& e) {
    fail(file.string(), ": ", e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  size_t bad = utf8_invalid_offset(text);
  if (bad != std::string_view::npos)
    fail("tokenizer: input is not valid UTF-8 (byte ", bad, " of ", text.size(),
         "); replace invalid bytes first (tokenizer::utf8_lossy)");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (im.raw_matcher.empty()) {
    im.encode_segment(text, true, ids);
  } else {
    std::vector<AddedMatcher::Split> splits;
    im.raw_matcher.find(text, im.added, splits);
    for (const auto& sp : splits) {
      if (sp.token >= 0) ids.push_back(im.added[sp.token].id);
      else im.encode_segment(text.substr(sp.start, sp.end - sp.start), sp.start == 0, ids);
    }
  }
  if (add_special_tokens) im.post_processor.apply(ids);
  return ids;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 16)
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      out[i] = encode(texts[i], add_special_tokens);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

void copy_tokenizer_files(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  if (from.empty()) return;
  const fs::path dst(to);
  if (is_gguf_file(from)) {  // a GGUF's vocabulary, written out as the files it stands for
    const Json meta = read_gguf(from).metadata;
    if (!meta.contains("tokenizer.ggml.model")) return;
    const auto dump = [](const Json& j) { return j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n"; };
    write_file_atomic((dst / "tokenizer.json").string(), dump(gguf_tokenizer_json(meta, from)));
    write_file_atomic((dst / "tokenizer_config.json").string(), dump(gguf_tokenizer_config(meta, from)));
    return;
  }
  const fs::path src = fs::is_directory(from) ? fs::path(from) : fs::path(from).parent_path();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"}) {
    if (!fs::exists(src / f) || (fs::exists(dst / f) && fs::equivalent(src / f, dst / f))) continue;
    std::error_code ec;
    fs::copy_file(src / f, dst / f, fs::copy_options::overwrite_existing, ec);
    ASTRAI_CHECK(!ec, "cannot copy ", (src / f).string(), " to ", dst.string(), ": ", ec.message());
  }
}

std::string Tokenizer::token_text(int32_t id) const {
  const std::vector<int32_t> anchor = encode("a", /*add_special_tokens=*/false);
  if (anchor.size() != 1) return decode(std::vector<int32_t>{id});
  const std::string alone = decode(anchor);
  const std::string both = decode(std::vector<int32_t>{anchor[0], id});
  if (both.size() < alone.size() || both.compare(0, alone.size(), alone) != 0) return decode(std::vector<int32_t>{id});
  return both.substr(alone.size());
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto a = im.added_by_id.find(id);
    if (a != im.added_by_id.end()) {
      if (skip_special_tokens && im.added[a->second].special) continue;
      tokens.push_back(im.added[a->second].content);
    } else if (const std::string* t = im.model->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  return im.decoder.decode(std::move(tokens));
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }
size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::is_special(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
int32_t Tokenizer::pad_id() const { return impl_->pad_id; }
int32_t Tokenizer::unk_id() const { return impl_->unk_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
const std::string& Tokenizer::pad_token() const { return impl_->pad; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::vector<Tokenizer::TurnEnd> Tokenizer::end_of_turn_tokens() const {
  std::vector<TurnEnd> out;
  auto add = [&](const std::string& text, int32_t id) {
    for (const TurnEnd& e : out)
      if (e.id == id) return;
    out.push_back(TurnEnd{text, id});
  };
  if (eos_id() >= 0) add(eos_token(), eos_id());
  for (const char* m : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>",
                        "<|END_OF_TURN_TOKEN|>", "<|endoftext|>", "<|end_of_text|>", "</s>"}) {
    const auto id = token_to_id(m);
    if (id && is_special(*id)) add(m, *id);
  }
  return out;
}
std::optional<std::string> Tokenizer::chat_template(const std::string& name) const {
  for (const auto& [n, t] : impl_->named_templates)
    if (n == name) return t;
  if (name == "default" && !impl_->chat_template.empty()) return impl_->chat_template;
  return std::nullopt;
}
const Json& Tokenizer::config() const { return impl_->config; }

}  // namespace astrai::tokenizer
