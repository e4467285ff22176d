#include "data/preprocess.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "data/shard.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace astrai::data {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

namespace {

enum class Kind { kNone, kLm, kPreference, kPrompt };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kLm: return "lm";
    case Kind::kPreference: return "preference";
    case Kind::kPrompt: return "prompt";
    default: return "none";
  }
}

struct Doc {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

struct Encoded {
  Kind kind = Kind::kNone;
  std::string source;  // "text" | "chat" | "instruction" | "preference" | "prompt"
  std::vector<Doc> docs;  // lm documents
  Doc chosen, rejected, prompt;
  std::optional<float> reward;
  std::optional<std::string> answer;
  int64_t retokenized = 0;
  bool split_turns = false;
  std::string error;
};

struct RawRecord {
  std::string text;   // a text document, or one JSONL line
  std::string where;  // file:line for messages
  bool is_json = false;
};

// A piece of rendered text and whether its tokens are trained.
struct Span {
  std::string text;
  bool train = false;
};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

std::string string_field(const OJson& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) fail(where, ": missing field \"", key, "\"");
  if (!it->is_string()) fail(where, ": field \"", key, "\" must be a string");
  return it->get<std::string>();
}

class Encoder {
 public:
  Encoder(const PreprocessOptions& options, tokenizer::Tokenizer tok) : options_(options), tok_(std::move(tok)) {
    if (!tok_.chat_template().empty()) {
      std::map<std::string, std::string> specials;
      if (!tok_.bos_token().empty()) specials["bos_token"] = tok_.bos_token();
      if (!tok_.eos_token().empty()) specials["eos_token"] = tok_.eos_token();
      if (!tok_.pad_token().empty()) specials["pad_token"] = tok_.pad_token();
      chat_.emplace(tok_.chat_template(), specials);
    }
    for (const auto& e : tok_.end_of_turn_tokens()) end_markers_.push_back(e.text);
    // The post-processor's BOS, if it adds one (Llama-3 style); used where text is built
    // without a chat template.
    const auto probe = tok_.encode("a", true);
    if (!probe.empty() && tok_.bos_id() >= 0 && probe.front() == tok_.bos_id()) bos_ = tok_.bos_id();
  }

  bool has_chat() const { return chat_.has_value(); }
  const tokenizer::Tokenizer& tok() const { return tok_; }

  Encoded encode(const RawRecord& r) const {
    Encoded e;
    try {
      if (!r.is_json) {
        e.kind = Kind::kLm;
        e.source = "text";
        e.docs.push_back(encode_text(r.text));
        return e;
      }
      OJson j;
      try {
        j = OJson::parse(r.text);
      } catch (const nlohmann::json::exception& ex) {
        fail(r.where, ": invalid JSON: ", ex.what());
      }
      if (!j.is_object()) fail(r.where, ": a record must be a JSON object");
      encode_json(j, r.where, &e);
    } catch (const std::exception& ex) {
      e.error = ex.what();
    }
    return e;
  }

 private:
  Doc encode_text(const std::string& text) const {
    Doc d;
    d.tokens = tok_.encode(text, options_.add_special_tokens);
    if (options_.add_eos && tok_.eos_id() >= 0) d.tokens.push_back(tok_.eos_id());
    d.mask.assign(d.tokens.size(), 1);
    return d;
  }

  // Tokenizes spans one by one so span edges are token edges.
  Doc tokenize_spans(const std::vector<Span>& spans, bool with_bos, int64_t* retokenized) const {
    Doc d;
    std::string full;
    if (with_bos && bos_ >= 0) {
      d.tokens.push_back(bos_);
      d.mask.push_back(0);
    }
    for (const Span& s : spans) {
      if (s.text.empty()) continue;
      const auto ids = tok_.encode(s.text, false);
      d.tokens.insert(d.tokens.end(), ids.begin(), ids.end());
      d.mask.insert(d.mask.end(), ids.size(), s.train ? 1 : 0);
      full += s.text;
    }
    auto whole = tok_.encode(full, false);
    if (with_bos && bos_ >= 0) whole.insert(whole.begin(), bos_);
    if (whole != d.tokens) ++*retokenized;
    return d;
  }

  // End of an assistant span that starts at `begin` in render q: right after the first
  // end-of-turn marker (the EOS token or a well-known end-of-turn token) when there is one,
  // so text a template appends after the turn (a newline, an always-on generation header)
  // is never trained; otherwise the end of q.
  size_t span_end(const std::string& q, size_t begin) const {
    size_t best = std::string::npos;
    for (const std::string& m : end_markers_) {
      const size_t at = q.find(m, begin);
      if (at != std::string::npos && at + m.size() < best) best = at + m.size();
    }
    return best == std::string::npos ? q.size() : best;
  }

  std::string render(const OJson& messages, bool generation_prompt) const {
    return chat_->render(messages, OJson(nullptr), generation_prompt);
  }

  // Chat messages -> documents with loss on assistant spans (see preprocess.h).
  void encode_chat(const OJson& messages, const std::string& where, Encoded* e) const {
    if (!chat_) fail(where, ": chat messages need a tokenizer with a chat template");
    if (!messages.is_array() || messages.empty()) fail(where, ": \"messages\" must be a non-empty array");
    for (const auto& m : messages) {
      if (!m.is_object() || !m.contains("role")) fail(where, ": every message needs a \"role\"");
    }
    const std::string full = render(messages, false);
    struct Turn {
      size_t begin, end;
      std::string q;
    };
    std::vector<Turn> turns;
    bool consistent = true;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].value("role", "") != "assistant") continue;
      const OJson head(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
      const OJson upto(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      const std::string p = render(head, true);
      std::string q = render(upto, false);
      if (!starts_with(q, p)) {
        fail(where, ": the chat template renders assistant message ", i,
             " so that the generation prompt is not a prefix of it; cannot locate the assistant span");
      }
      const size_t end = span_end(q, p.size());
      if (full.compare(0, end, q, 0, end) != 0) consistent = false;
      turns.push_back(Turn{p.size(), end, std::move(q)});
    }
    if (turns.empty()) fail(where, ": no assistant message to train on");
    if (consistent) {
      std::vector<Span> spans;
      size_t pos = 0;
      for (const Turn& t : turns) {
        spans.push_back(Span{full.substr(pos, t.begin - pos), false});
        spans.push_back(Span{full.substr(t.begin, t.end - t.begin), true});
        pos = t.end;
      }
      spans.push_back(Span{full.substr(pos), false});
      e->docs.push_back(tokenize_spans(spans, false, &e->retokenized));
    } else {
      e->split_turns = true;
      for (const Turn& t : turns) {
        e->docs.push_back(tokenize_spans(
            {Span{t.q.substr(0, t.begin), false}, Span{t.q.substr(t.begin, t.end - t.begin), true}}, false,
            &e->retokenized));
      }
    }
  }

  // Prompt + one answer -> tokens with loss on the answer.
  Doc encode_pair(const OJson& prompt_messages, const std::string& prompt_text, const OJson& answer,
                  const std::string& where, const char* field, int64_t* retokenized) const {
    OJson msg;
    if (answer.is_string()) {
      msg = OJson{{"role", "assistant"}, {"content", answer.get<std::string>()}};
    } else if (answer.is_object() && answer.contains("content")) {
      msg = answer;
      if (!msg.contains("role")) msg["role"] = "assistant";
    } else {
      fail(where, ": field \"", field, "\" must be a string or a message object");
    }
    if (chat_ && options_.chat_template) {
      OJson all = prompt_messages;
      all.push_back(msg);
      const std::string p = render(prompt_messages, true);
      const std::string q = render(all, false);
      if (!starts_with(q, p)) fail(where, ": the chat template's generation prompt is not a prefix of the \"", field,
                                   "\" conversation; cannot locate the answer span");
      const size_t end = span_end(q, p.size());
      return tokenize_spans({Span{p, false}, Span{q.substr(p.size(), end - p.size()), true}}, false, retokenized);
    }
    std::string text = msg["content"].is_string() ? msg["content"].get<std::string>() : msg["content"].dump();
    Doc d = tokenize_spans({Span{prompt_text, false}, Span{text, true}}, true, retokenized);
    if (options_.add_eos && tok_.eos_id() >= 0) {
      d.tokens.push_back(tok_.eos_id());
      d.mask.push_back(1);
    }
    return d;
  }

  // The prompt of an instruction / preference / prompt record, as messages and as plain text.
  void prompt_of(const OJson& j, const std::string& where, OJson* messages, std::string* text) const {
    if (j.contains("messages")) {
      *messages = j["messages"];
      if (!messages->is_array() || messages->empty()) fail(where, ": \"messages\" must be a non-empty array");
      text->clear();
      for (const auto& m : *messages) {
        if (m.contains("content") && m["content"].is_string()) *text += m["content"].get<std::string>() + "\n";
      }
      return;
    }
    std::string p = j.contains("prompt") ? string_field(j, "prompt", where) : string_field(j, "instruction", where);
    if (j.contains("input") && j["input"].is_string() && !j["input"].get<std::string>().empty()) {
      p += "\n\n" + j["input"].get<std::string>();
    }
    *messages = OJson::array({OJson{{"role", "user"}, {"content", p}}});
    *text = p + "\n";
  }

  void encode_json(const OJson& j, const std::string& where, Encoded* e) const {
    if (j.contains("chosen") || j.contains("rejected")) {
      if (!j.contains("chosen") || !j.contains("rejected")) fail(where, ": a preference pair needs both \"chosen\" and \"rejected\"");
      e->kind = Kind::kPreference;
      e->source = "preference";
      OJson msgs;
      std::string text;
      prompt_of(j, where, &msgs, &text);
      e->chosen = encode_pair(msgs, text, j["chosen"], where, "chosen", &e->retokenized);
      e->rejected = encode_pair(msgs, text, j["rejected"], where, "rejected", &e->retokenized);
      return;
    }
    if (j.contains("text")) {
      e->kind = Kind::kLm;
      e->source = "text";
      e->docs.push_back(encode_text(string_field(j, "text", where)));
      return;
    }
    const char* response_key = j.contains("response") ? "response"
                               : j.contains("output") ? "output"
                               : j.contains("completion") ? "completion"
                                                          : nullptr;
    if (j.contains("messages") && !response_key) {
      const auto& m = j["messages"];
      const bool has_assistant =
          m.is_array() && std::any_of(m.begin(), m.end(), [](const OJson& x) {
            return x.is_object() && x.value("role", "") == "assistant";
          });
      if (has_assistant) {
        e->kind = Kind::kLm;
        e->source = "chat";
        encode_chat(m, where, e);
        return;
      }
    }
    if (response_key && (j.contains("prompt") || j.contains("instruction") || j.contains("messages"))) {
      e->kind = Kind::kLm;
      e->source = "instruction";
      OJson msgs;
      std::string text;
      prompt_of(j, where, &msgs, &text);
      const std::string resp = string_field(j, response_key, where);
      e->docs.push_back(encode_pair(msgs, text, OJson(resp), where, response_key, &e->retokenized));
      return;
    }
    if (j.contains("prompt") || j.contains("messages")) {
      e->kind = Kind::kPrompt;
      e->source = "prompt";
      OJson msgs;
      std::string text;
      prompt_of(j, where, &msgs, &text);
      if (chat_ && options_.chat_template) {
        e->prompt.tokens = tok_.encode(render(msgs, true), false);
      } else {
        e->prompt.tokens = tok_.encode(j.contains("prompt") ? string_field(j, "prompt", where) : text,
                                       options_.add_special_tokens);
      }
      if (auto r = j.find("reward"); r != j.end() && !r->is_null()) {
        if (!r->is_number()) fail(where, ": \"reward\" must be a number");
        e->reward = r->get<float>();
      }
      if (auto a = j.find("answer"); a != j.end() && !a->is_null()) {
        e->answer = a->is_string() ? a->get<std::string>() : a->dump();
      }
      return;
    }
    fail(where, ": unrecognised record; expected \"text\", \"messages\", \"prompt\"/\"instruction\" with "
         "\"response\"/\"output\", or \"prompt\" with \"chosen\" and \"rejected\"");
  }

  const PreprocessOptions& options_;
  tokenizer::Tokenizer tok_;
  std::optional<tokenizer::ChatTemplate> chat_;
  int32_t bos_ = -1;
  std::vector<std::string> end_markers_;
};

// Reads inputs record by record, in order.
class RecordReader {
 public:
  RecordReader(const PreprocessOptions& o) : options_(o) {
    ASTRAI_CHECK(o.format == "jsonl" || o.format == "text", "preprocess: unknown format \"", o.format,
                 "\" (expected text or jsonl)");
    ASTRAI_CHECK(o.text_split == "file" || o.text_split == "line" || o.text_split == "blank",
                 "preprocess: unknown text split \"", o.text_split, "\" (expected file, line or blank)");
    for (const auto& f : o.inputs) {
      std::error_code ec;
      ASTRAI_CHECK(fs::is_regular_file(f, ec), "preprocess: input ", f, " is not a readable file");
      total_bytes_ += static_cast<int64_t>(fs::file_size(f, ec));
    }
  }

  int64_t total_bytes() const { return total_bytes_; }
  int64_t bytes_read() const { return bytes_read_; }

  // Fills up to n records; returns false when the inputs are exhausted and nothing was read.
  bool next(int64_t n, std::vector<RawRecord>* out) {
    out->clear();
    while (static_cast<int64_t>(out->size()) < n) {
      if (!pending_.empty()) {
        out->push_back(std::move(pending_.front()));
        pending_.pop_front();
        continue;
      }
      if (options_.format == "jsonl") {
        if (!jsonl_.is_open()) {
          if (file_ >= options_.inputs.size()) break;
          jsonl_.open(options_.inputs[file_], std::ios::binary);
          ASTRAI_CHECK(jsonl_.is_open(), "preprocess: cannot open ", options_.inputs[file_]);
          line_ = 0;
        }
        std::string line;
        if (!std::getline(jsonl_, line)) {
          jsonl_.close();
          ++file_;
          continue;
        }
        ++line_;
        bytes_read_ += static_cast<int64_t>(line.size()) + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        out->push_back(RawRecord{std::move(line), options_.inputs[file_] + ":" + std::to_string(line_), true});
      } else {
        if (file_ >= options_.inputs.size()) break;
        const std::string& path = options_.inputs[file_++];
        std::string text = tokenizer::utf8_lossy(read_file(path));
        bytes_read_ += static_cast<int64_t>(text.size());
        split_text(text, path);
      }
    }
    return !out->empty();
  }

 private:
  void split_text(const std::string& text, const std::string& path) {
    auto add = [&](std::string doc, int64_t line) {
      if (doc.find_first_not_of(" \t\r\n") == std::string::npos) return;
      pending_.push_back(RawRecord{std::move(doc), path + ":" + std::to_string(line), false});
    };
    if (options_.text_split == "file") {
      add(text, 1);
      return;
    }
    int64_t line_no = 0, para_start = 1;
    std::string para;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string line = text.substr(pos, nl - pos);
      ++line_no;
      if (options_.text_split == "line") {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        add(line, line_no);
      } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
        add(para, para_start);
        para.clear();
        para_start = line_no + 1;
      } else {
        para += line;
        para += '\n';
      }
      pos = nl + 1;
    }
    if (options_.text_split == "blank") add(para, para_start);
  }

  const PreprocessOptions& options_;
  size_t file_ = 0;
  std::ifstream jsonl_;
  int64_t line_ = 0;
  int64_t total_bytes_ = 0;
  int64_t bytes_read_ = 0;
  std::deque<RawRecord> pending_;
};

}  // namespace

Json preprocess(const PreprocessOptions& options) {
  ASTRAI_CHECK(!options.inputs.empty(), "preprocess: no input files");
  ASTRAI_CHECK(!options.output.empty(), "preprocess: no output directory");
  ASTRAI_CHECK(options.seq_len >= 0, "preprocess: --seq-len must not be negative");
  ASTRAI_CHECK(options.batch_records > 0, "preprocess: batch size must be positive");
  const std::string tok_json_path =
      fs::is_directory(options.tokenizer) ? options.tokenizer + "/tokenizer.json" : options.tokenizer;
  Encoder encoder(options, tokenizer::Tokenizer::load(options.tokenizer));
  const tokenizer::Tokenizer& tok = encoder.tok();
  const auto vocab = static_cast<int64_t>(tok.vocab_size());
  RecordReader reader(options);

  const bool packed = options.seq_len > 0;
  const Packing mode = packed ? options.packing : Packing::kNone;
  const int64_t row_len = packed ? options.seq_len + 1 : 0;
  const int32_t pad_id = tok.pad_id() >= 0 ? tok.pad_id() : (tok.eos_id() >= 0 ? tok.eos_id() : 0);
  const DType token_dtype = vocab <= 65536 ? DType::kU16 : DType::kI32;

  ShardWriter writer(options.output, options.overwrite);
  Kind kind = Kind::kNone;
  std::optional<Packer> packer;
  std::map<std::string, int64_t> sources;
  int64_t records = 0, documents = 0, tokens = 0, loss_tokens = 0, retokenized = 0, split_turns = 0;
  bool has_reward = false, has_answer = false;

  auto start_kind = [&](Kind k, const Encoded& first) {
    kind = k;
    if (k == Kind::kLm) {
      writer.add_key("sequence", token_dtype, true);
      writer.add_key("loss_mask", DType::kU8);
      writer.add_key("position_ids", packed && row_len <= 65536 ? DType::kU16 : DType::kI32);
      packer.emplace(mode, row_len, pad_id, [&](const PackedRow& r) {
        writer.add_record("sequence", r.tokens);
        std::vector<int32_t> m(r.loss_mask.begin(), r.loss_mask.end());
        writer.add_record("loss_mask", m);
        writer.add_record("position_ids", r.position_ids);
      }, options.pack_buffer_tokens);
    } else if (k == Kind::kPreference) {
      writer.add_key("chosen", token_dtype, true);
      writer.add_key("chosen_mask", DType::kU8);
      writer.add_key("rejected", token_dtype, true);
      writer.add_key("rejected_mask", DType::kU8);
    } else {
      writer.add_key("prompt", token_dtype, true);
      // Optional per-prompt fields: declared from the first record; later records must agree.
      has_reward = first.reward.has_value();
      has_answer = first.answer.has_value();
      if (has_reward) writer.add_key("reward", DType::kF32);
      if (has_answer) writer.add_key("answer", DType::kU8);
    }
  };

  std::vector<RawRecord> batch;
  std::vector<Encoded> encoded;
  while (reader.next(options.batch_records, &batch)) {
    encoded.assign(batch.size(), Encoded{});
    const auto n = static_cast<int64_t>(batch.size());
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t i = 0; i < n; ++i) encoded[i] = encoder.encode(batch[i]);
    for (int64_t i = 0; i < n; ++i) {
      Encoded& e = encoded[i];
      if (!e.error.empty()) fail(e.error);
      if (kind == Kind::kNone) start_kind(e.kind, e);
      if (e.kind != kind) {
        fail(batch[i].where, ": a ", kind_name(e.kind), " record (", e.source, ") in a ", kind_name(kind),
             " dataset; preference pairs, prompts and training text cannot be mixed in one run");
      }
      ++records;
      ++sources[e.source];
      retokenized += e.retokenized;
      split_turns += e.split_turns;
      auto count = [&](const Doc& d) {
        tokens += static_cast<int64_t>(d.tokens.size());
        for (uint8_t m : d.mask) loss_tokens += m;
      };
      switch (kind) {
        case Kind::kLm:
          for (const Doc& d : e.docs) {
            ++documents;
            count(d);
            packer->add(d.tokens, d.mask);
          }
          break;
        case Kind::kPreference: {
          ++documents;
          count(e.chosen);
          count(e.rejected);
          std::vector<int32_t> cm(e.chosen.mask.begin(), e.chosen.mask.end());
          std::vector<int32_t> rm(e.rejected.mask.begin(), e.rejected.mask.end());
          writer.add_record("chosen", e.chosen.tokens);
          writer.add_record("chosen_mask", cm);
          writer.add_record("rejected", e.rejected.tokens);
          writer.add_record("rejected_mask", rm);
          break;
        }
        case Kind::kPrompt: {
          ++documents;
          tokens += static_cast<int64_t>(e.prompt.tokens.size());
          writer.add_record("prompt", e.prompt.tokens);
          if (e.reward.has_value() != has_reward || e.answer.has_value() != has_answer) {
            fail(batch[i].where, ": every prompt record must have the same optional fields (reward/answer) as the first");
          }
          if (has_reward) writer.add_record("reward", std::vector<float>{*e.reward});
          if (has_answer) {
            std::vector<int32_t> bytes(e.answer->begin(), e.answer->end());
            for (auto& b : bytes) b &= 0xff;
            writer.add_record("answer", bytes);
          }
          break;
        }
        default: break;
      }
    }
    if (options.progress) options.progress(records, tokens, reader.bytes_read(), reader.total_bytes());
  }
  ASTRAI_CHECK(records > 0, "preprocess: the inputs hold no records");

  Json stats = {{"records", records},         {"documents", documents},   {"tokens", tokens},
                {"loss_tokens", loss_tokens}, {"retokenized", retokenized}, {"split_conversations", split_turns},
                {"sources", sources}};
  Json packing = {{"mode", std::string(packing_name(mode))}};
  if (kind == Kind::kLm) {
    packer->flush();
    writer.add_group({"sequence", "loss_mask", "position_ids"});
    const PackingStats& ps = packer->stats();
    packing["rows"] = ps.rows;
    packing["padding"] = ps.padding;
    packing["split_documents"] = ps.split_documents;
    if (packed) {
      packing["seq_len"] = options.seq_len;
      packing["row_len"] = row_len;
      packing["pad_id"] = pad_id;
    }
  } else if (kind == Kind::kPreference) {
    writer.add_group({"chosen", "chosen_mask"});
    writer.add_group({"rejected", "rejected_mask"});
  }
  std::string tok_checksum;
  if (file_exists(tok_json_path)) {
    const std::string bytes = read_file(tok_json_path);
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx",
                  static_cast<unsigned long long>(
                      shard_checksum(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
    tok_checksum = buf;
  }
  Json inputs = Json::array();
  for (const auto& f : options.inputs) inputs.push_back(fs::absolute(f).string());
  Json extra = {{"kind", kind_name(kind)},
                {"tokenizer",
                 {{"path", fs::absolute(options.tokenizer).string()},
                  {"vocab_size", vocab},
                  {"bos_id", tok.bos_id()},
                  {"eos_id", tok.eos_id()},
                  {"pad_id", tok.pad_id()},
                  {"checksum", tok_checksum}}},
                {"packing", packing},
                {"stats", stats},
                {"preprocess",
                 {{"format", options.format},
                  {"inputs", inputs},
                  {"add_eos", options.add_eos},
                  {"chat_template", encoder.has_chat() && options.chat_template},
                  {"assistant_spans", "prefix-render"}}}};
  writer.finish(extra);
  return read_json_file(options.output + "/meta.json");
}

}  // namespace astrai::data
