#include "tokenizer/pipeline.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/bpe.h"
#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <unordered_map>

namespace astrai::tokenizer {

namespace {

// Unicode White_Space, which Oniguruma's \s matches (PCRE2's UCP \s omits U+0085).
constexpr const char* kWhiteSpaceSet =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Code points Oniguruma (Unicode 16, in HF) classifies but PCRE2 10.42 (Unicode 14) does
// not know yet, per general category, as PCRE2 class ranges ("\\x{..}-\\x{..}...").
const std::string& newer_ranges(const std::string& gc) {
  struct Range {
    uint32_t first, last;
    const char* gc;
  };
  static const Range kTable[] = {
#include "tokenizer/unicode_gc.inc"
  };
  static const std::unordered_map<std::string, std::string> by_gc = [] {
    std::unordered_map<std::string, std::string> m;
    for (const Range& r : kTable) {
      for (uint32_t cp = r.first; cp <= r.last; ++cp) {
        UVersionInfo age;
        u_charAge(static_cast<UChar32>(cp), age);
        if (age[0] != 0 && age[0] < 15) continue;  // PCRE2 knows it
        uint32_t last = cp;
        while (last < r.last) {
          u_charAge(static_cast<UChar32>(last + 1), age);
          if (age[0] != 0 && age[0] < 15) break;
          ++last;
        }
        char buf[48];
        std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", cp, last);
        std::string& out = m[r.gc];
        out += buf;
        m[std::string(1, r.gc[0])] += buf;
        cp = last;
      }
    }
    return m;
  }();
  static const std::string none;
  auto it = by_gc.find(gc);
  return it == by_gc.end() ? none : it->second;
}

std::string translate_onig(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) out += kWhiteSpaceSet;
        else out += std::string("[") + kWhiteSpaceSet + "]";
      } else if (e == 'S' && !in_class) {
        out += std::string("[^") + kWhiteSpaceSet + "]";
      } else if ((e == 'p' || e == 'P') && i + 1 < p.size() && p[i + 1] == '{' &&
                 p.find('}', i + 1) != std::string::npos) {
        size_t close = p.find('}', i + 1);
        std::string name = p.substr(i + 2, close - i - 2);
        std::string prop = std::string("\\") + e + p.substr(i + 1, close - i);
        const std::string& extra = newer_ranges(name);
        i = close;
        if (extra.empty() || (e == 'P' && in_class)) {
          out += prop;
        } else if (in_class) {
          out += prop + extra;
        } else {
          out += std::string(e == 'P' ? "[^" : "[") + "\\p{" + name + "}" + extra + "]";
        }
      } else if (e == 'h') {
        // Ruby syntax: \h is a hex digit (PCRE2: horizontal space).
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after '[' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& onig_pattern) {
  std::string p = translate_onig(onig_pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err,
                                   &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer: cannot compile regex \"", onig_pattern, "\" at offset ", off, ": ",
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

size_t Regex::step(std::string_view s, size_t pos) {
  return pos < s.size() ? utf8_len(static_cast<uint8_t>(s[pos])) : 1;
}

bool Regex::next_match(std::string_view s, size_t pos, size_t* start, size_t* end) const {
  if (pos > s.size()) return false;
  MatchScratch& m = scratch();
  int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                       PCRE2_NO_UTF_CHECK, m.data, m.ctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail("tokenizer: regex match failed: ", reinterpret_cast<const char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
  *start = ov[0];
  *end = ov[1];
  return true;
}

Pattern::Pattern(const Json& j, const std::string& where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    literal_ = j["String"].get<std::string>();
  } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(j["Regex"].get<std::string>());
  } else {
    fail(where, ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
}

void Pattern::find_matches(std::string_view s,
                           std::vector<std::pair<std::pair<uint32_t, uint32_t>, bool>>& out) const {
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return;
  }
  size_t prev = 0;
  auto on_match = [&](size_t a, size_t b) {
    if (prev != a) out.push_back({{uint32_t(prev), uint32_t(a)}, false});
    out.push_back({{uint32_t(a), uint32_t(b)}, true});
    prev = b;
  };
  if (regex_) {
    regex_->for_each_match(s, on_match);
  } else if (!literal_.empty()) {
    for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, at + literal_.size()))
      on_match(at, at + literal_.size());
  }
  if (prev != s.size()) out.push_back({{uint32_t(prev), uint32_t(s.size())}, false});
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  size_t prev = 0;
  auto on_match = [&](size_t a, size_t b) {
    out.append(s.substr(prev, a - prev));
    out.append(content);
    prev = b;
  };
  if (regex_) {
    regex_->for_each_match(s, [&](size_t a, size_t b) {
      if (b > a) on_match(a, b);
    });
  } else if (!literal_.empty()) {
    for (size_t at = s.find(literal_); at != std::string_view::npos; at = s.find(literal_, at + literal_.size()))
      on_match(at, at + literal_.size());
  }
  out.append(s.substr(prev));
  return out;
}

// ---------------------------------------------------------------- normalizers

Normalizer::Normalizer(const Json& j) {
  if (!j.is_null()) add(j);
}

void Normalizer::add(const Json& j) {
  const std::string where = "tokenizer.json normalizer";
  std::string type = json_required<std::string>(j, "type", where);
  if (type == "Sequence") {
    for (const Json& n : json_required<Json>(j, "normalizers", where)) add(n);
    return;
  }
  Step s;
  s.type = type;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Lowercase" ||
      type == "StripAccents") {
  } else if (type == "Prepend") {
    s.str = json_required<std::string>(j, "prepend", where);
  } else if (type == "Replace") {
    s.pattern = std::make_shared<Pattern>(json_required<Json>(j, "pattern", where), where);
    s.str = json_required<std::string>(j, "content", where);
  } else if (type == "Strip") {
    s.left = json_optional<bool>(j, "strip_left", false, where);
    s.right = json_optional<bool>(j, "strip_right", false, where);
  } else {
    fail(where, ": normalizer type \"", type, "\" is not supported");
  }
  steps_.push_back(std::move(s));
}

std::string Normalizer::apply(std::string_view in) const {
  std::string s(in);
  for (const Step& st : steps_) {
    const std::string& t = st.type;
    if (t == "NFC") s = unicode_normalize(s, NormalForm::kNFC);
    else if (t == "NFD") s = unicode_normalize(s, NormalForm::kNFD);
    else if (t == "NFKC") s = unicode_normalize(s, NormalForm::kNFKC);
    else if (t == "NFKD") s = unicode_normalize(s, NormalForm::kNFKD);
    else if (t == "Lowercase") s = unicode_lowercase(s);
    else if (t == "Prepend") {
      if (!s.empty()) s = st.str + s;
    } else if (t == "Replace") {
      s = st.pattern->replace_all(s, st.str);
    } else if (t == "Strip") {
      size_t a = 0, b = s.size();
      if (st.left) {
        while (a < b) {
          size_t i = a;
          if (!is_white_space(utf8_next(s, i))) break;
          a = i;
        }
      }
      if (st.right) {
        while (b > a) {
          size_t p;
          if (!is_white_space(utf8_prev(s, b, &p))) break;
          b = p;
        }
      }
      s = s.substr(a, b - a);
    } else if (t == "StripAccents") {
      std::string o;
      for (size_t i = 0; i < s.size();) {
        size_t st0 = i;
        char32_t c = utf8_next(s, i);
        if (u_charType(static_cast<UChar32>(c)) != U_NON_SPACING_MARK) o.append(s, st0, i - st0);
      }
      s = std::move(o);
    }
  }
  return s;
}

// ---------------------------------------------------------------- pre-tokenizers

namespace {
// GPT-2's pattern, used by ByteLevel when use_regex is set.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

int parse_prepend(const Json& j, const std::string& where) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return 0;
    if (s == "first") return 1;
    if (s == "never") return 2;
    fail(where, ": unknown prepend_scheme \"", s, "\"");
  }
  return json_optional<bool>(j, "add_prefix_space", true, where) ? 0 : 2;
}

char32_t single_char(const std::string& s, const std::string& where) {
  size_t i = 0;
  if (s.empty()) fail(where, ": replacement must be one character");
  char32_t c = utf8_next(s, i);
  if (i != s.size()) fail(where, ": replacement must be one character");
  return c;
}
}  // namespace

PreTokenizer::PreTokenizer(const Json& j) {
  if (!j.is_null()) add(j);
  for (size_t i = 0; i + 1 < steps_.size(); ++i)
    if (steps_[i].kind == Kind::kByteLevel)
      fail("tokenizer.json pre_tokenizer: ByteLevel must be the last pre-tokenizer of the sequence");
  byte_level_ = !steps_.empty() && steps_.back().kind == Kind::kByteLevel;
}

PreTokenizer::Behavior PreTokenizer::parse_behavior(const std::string& s, const std::string& where) {
  if (s == "Removed") return Behavior::kRemoved;
  if (s == "Isolated") return Behavior::kIsolated;
  if (s == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::kMergedWithNext;
  if (s == "Contiguous") return Behavior::kContiguous;
  fail(where, ": unknown split behavior \"", s, "\"");
}

void PreTokenizer::add(const Json& j) {
  const std::string where = "tokenizer.json pre_tokenizer";
  std::string type = json_required<std::string>(j, "type", where);
  if (type == "Sequence") {
    for (const Json& p : json_required<Json>(j, "pretokenizers", where)) add(p);
    return;
  }
  Step s;
  if (type == "Split") {
    s.kind = Kind::kSplit;
    s.pattern = std::make_shared<Pattern>(json_required<Json>(j, "pattern", where), where);
    s.behavior = parse_behavior(json_required<std::string>(j, "behavior", where), where);
    s.invert = json_optional<bool>(j, "invert", false, where);
  } else if (type == "ByteLevel") {
    s.kind = Kind::kByteLevel;
    s.add_prefix_space = json_optional<bool>(j, "add_prefix_space", true, where);
    s.use_regex = json_optional<bool>(j, "use_regex", true, where);
    if (s.use_regex) s.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else if (type == "Metaspace") {
    s.kind = Kind::kMetaspace;
    s.replacement = json_optional<std::string>(j, "replacement", "\xE2\x96\x81", where);
    single_char(s.replacement, where);
    s.prepend = parse_prepend(j, where);
    s.split = json_optional<bool>(j, "split", true, where);
  } else if (type == "WhitespaceSplit") {
    s.kind = Kind::kWhitespaceSplit;
  } else if (type == "Whitespace") {
    s.kind = Kind::kWhitespace;
    s.regex = std::make_shared<Regex>("\\w+|[^\\w\\s]+");
  } else if (type == "Digits") {
    s.kind = Kind::kDigits;
    s.individual = json_optional<bool>(j, "individual_digits", false, where);
  } else if (type == "Punctuation") {
    s.kind = Kind::kPunctuation;
    s.behavior = parse_behavior(json_optional<std::string>(j, "behavior", "Isolated", where), where);
  } else {
    fail(where, ": pre-tokenizer type \"", type, "\" is not supported");
  }
  steps_.push_back(std::move(s));
}

namespace {
using Matches = std::vector<std::pair<std::pair<uint32_t, uint32_t>, bool>>;

template <typename Pred>
void char_matches(std::string_view s, Pred pred, Matches& out) {
  size_t prev = 0;
  for (size_t i = 0; i < s.size();) {
    size_t a = i;
    char32_t c = utf8_next(s, i);
    if (pred(c)) {
      if (prev != a) out.push_back({{uint32_t(prev), uint32_t(a)}, false});
      out.push_back({{uint32_t(a), uint32_t(i)}, true});
      prev = i;
    }
  }
  if (prev != s.size() || s.empty()) out.push_back({{uint32_t(prev), uint32_t(s.size())}, false});
}

bool is_numeric(char32_t c) {
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return std::ispunct(static_cast<int>(c)) != 0;
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_CONNECTOR_PUNCTUATION || t == U_DASH_PUNCTUATION || t == U_START_PUNCTUATION ||
         t == U_END_PUNCTUATION || t == U_INITIAL_PUNCTUATION || t == U_FINAL_PUNCTUATION ||
         t == U_OTHER_PUNCTUATION;
}
}  // namespace

void PreTokenizer::split_pieces(const Step& st, Pieces& p) const {
  // HF NormalizedString::split: matches cover the piece; the behavior decides which
  // become pieces; empty pieces are dropped.
  std::vector<std::pair<uint32_t, uint32_t>> out;
  out.reserve(p.ranges.size() * 2);
  Matches m;
  Behavior behavior = st.behavior;
  for (auto [a, b] : p.ranges) {
    std::string_view s(p.buf.data() + a, b - a);
    m.clear();
    bool invert = st.invert;
    switch (st.kind) {
      case Kind::kSplit: st.pattern->find_matches(s, m); break;
      case Kind::kByteLevel:
      case Kind::kWhitespace: {
        size_t prev = 0;
        st.regex->for_each_match(s, [&](size_t x, size_t y) {
          if (prev != x) m.push_back({{uint32_t(prev), uint32_t(x)}, false});
          m.push_back({{uint32_t(x), uint32_t(y)}, true});
          prev = y;
        });
        if (prev != s.size()) m.push_back({{uint32_t(prev), uint32_t(s.size())}, false});
        behavior = st.kind == Kind::kByteLevel ? Behavior::kIsolated : Behavior::kRemoved;
        invert = st.kind == Kind::kWhitespace;
        break;
      }
      case Kind::kWhitespaceSplit:
        char_matches(s, is_white_space, m);
        behavior = Behavior::kRemoved;
        break;
      case Kind::kDigits:
        char_matches(s, is_numeric, m);
        behavior = st.individual ? Behavior::kIsolated : Behavior::kContiguous;
        break;
      case Kind::kPunctuation: char_matches(s, is_punctuation, m); break;
      case Kind::kMetaspace: {
        std::string_view rep = st.replacement;
        size_t prev = 0;
        for (size_t at = s.find(rep); at != std::string_view::npos; at = s.find(rep, at + rep.size())) {
          if (prev != at) m.push_back({{uint32_t(prev), uint32_t(at)}, false});
          m.push_back({{uint32_t(at), uint32_t(at + rep.size())}, true});
          prev = at + rep.size();
        }
        if (prev != s.size()) m.push_back({{uint32_t(prev), uint32_t(s.size())}, false});
        behavior = Behavior::kMergedWithNext;
        break;
      }
    }
    if (invert)
      for (auto& e : m) e.second = !e.second;
    size_t first = out.size();
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kRemoved:
        for (auto& [r, is_match] : m)
          if (!is_match) out.push_back(r);
        break;
      case Behavior::kIsolated:
        for (auto& [r, is_match] : m) out.push_back(r);
        break;
      case Behavior::kMergedWithPrevious:
        for (auto& [r, is_match] : m) {
          if (is_match && !previous_match && out.size() > first) out.back().second = r.second;
          else out.push_back(r);
          previous_match = is_match;
        }
        break;
      case Behavior::kContiguous:
        for (auto& [r, is_match] : m) {
          if (is_match == previous_match && out.size() > first) out.back().second = r.second;
          else out.push_back(r);
          previous_match = is_match;
        }
        break;
      case Behavior::kMergedWithNext: {
        std::vector<std::pair<uint32_t, uint32_t>> rev;
        for (size_t k = m.size(); k-- > 0;) {
          auto& [r, is_match] = m[k];
          if (is_match && !previous_match && !rev.empty()) rev.back().first = r.first;
          else rev.push_back(r);
          previous_match = is_match;
        }
        out.insert(out.end(), rev.rbegin(), rev.rend());
        break;
      }
    }
    // Offsets were relative to the piece; drop empties.
    size_t w = first;
    for (size_t k = first; k < out.size(); ++k) {
      if (out[k].second > out[k].first) out[w++] = {out[k].first + a, out[k].second + a};
    }
    out.resize(w);
  }
  p.ranges = std::move(out);
}

void PreTokenizer::apply(std::string_view segment, bool first_segment, Pieces& p) const {
  p.buf.assign(segment);
  p.ranges.clear();
  if (!segment.empty()) p.ranges.push_back({0, uint32_t(segment.size())});
  for (const Step& st : steps_) {
    if (st.kind == Kind::kByteLevel && st.add_prefix_space) {
      std::string nb;
      nb.reserve(p.buf.size() + p.ranges.size());
      for (auto& r : p.ranges) {
        uint32_t a = uint32_t(nb.size());
        if (p.buf[r.first] != ' ') nb += ' ';
        nb.append(p.buf, r.first, r.second - r.first);
        r = {a, uint32_t(nb.size())};
      }
      p.buf = std::move(nb);
    }
    if (st.kind == Kind::kMetaspace) {
      std::string nb;
      nb.reserve(p.buf.size() * 2);
      for (auto& r : p.ranges) {
        uint32_t a = uint32_t(nb.size());
        std::string_view piece(p.buf.data() + r.first, r.second - r.first);
        bool at_start = first_segment && r.first == 0;
        bool starts_rep = piece.substr(0, st.replacement.size()) == st.replacement || piece.substr(0, 1) == " ";
        if (!starts_rep && (st.prepend == 0 || (st.prepend == 1 && at_start))) nb += st.replacement;
        for (char c : piece) {
          if (c == ' ') nb += st.replacement;
          else nb += c;
        }
        r = {a, uint32_t(nb.size())};
      }
      p.buf = std::move(nb);
      if (!st.split) continue;
    }
    if (st.kind == Kind::kByteLevel && !st.use_regex) continue;
    split_pieces(st, p);
  }
}

// ---------------------------------------------------------------- decoders

Decoder::Decoder(const Json& j) {
  if (j.is_null()) return;
  none_ = false;
  add(j);
}

void Decoder::add(const Json& j) {
  const std::string where = "tokenizer.json decoder";
  std::string type = json_required<std::string>(j, "type", where);
  if (type == "Sequence") {
    for (const Json& d : json_required<Json>(j, "decoders", where)) add(d);
    return;
  }
  Step s;
  s.type = type;
  if (type == "ByteLevel" || type == "ByteFallback" || type == "Fuse") {
  } else if (type == "Replace") {
    s.pattern = std::make_shared<Pattern>(json_required<Json>(j, "pattern", where), where);
    s.content = json_required<std::string>(j, "content", where);
  } else if (type == "Strip") {
    s.ch = single_char(json_required<std::string>(j, "content", where), where);
    s.start = json_optional<size_t>(j, "start", 0, where);
    s.stop = json_optional<size_t>(j, "stop", 0, where);
  } else if (type == "Metaspace") {
    s.ch = single_char(json_optional<std::string>(j, "replacement", "\xE2\x96\x81", where), where);
    s.prepend = parse_prepend(j, where);
  } else if (type == "BPEDecoder") {
    s.content = json_optional<std::string>(j, "suffix", "</w>", where);
  } else {
    fail(where, ": decoder type \"", type, "\" is not supported");
  }
  steps_.push_back(std::move(s));
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (none_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const Step& st : steps_) {
    const std::string& t = st.type;
    if (t == "ByteLevel") {
      std::string bytes;
      for (const std::string& tok : tokens) {
        if (auto b = byte_level_to_bytes(tok)) bytes += *b;
        else bytes += tok;  // a token outside the alphabet decodes to its own UTF-8
      }
      tokens.assign(1, utf8_lossy(bytes));
    } else if (t == "Replace") {
      for (auto& tok : tokens) tok = st.pattern->replace_all(tok, st.content);
    } else if (t == "ByteFallback") {
      std::vector<std::string> out;
      std::string pending;
      auto flush = [&] {
        if (pending.empty()) return;
        if (utf8_invalid_offset(pending) == std::string::npos) {
          out.push_back(pending);
        } else {
          for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (auto& tok : tokens) {
        auto hex = [](char c) -> int {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' && hex(tok[3]) >= 0 &&
            hex(tok[4]) >= 0) {
          pending += static_cast<char>(hex(tok[3]) * 16 + hex(tok[4]));
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      tokens = std::move(out);
    } else if (t == "Fuse") {
      std::string all;
      for (auto& tok : tokens) all += tok;
      tokens.assign(1, std::move(all));
    } else if (t == "Strip") {
      for (auto& tok : tokens) {
        std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, char)
        for (size_t i = 0; i < tok.size();) {
          size_t a = i;
          chars.push_back({a, utf8_next(tok, i)});
        }
        size_t start_cut = 0;
        for (size_t i = 0; i < st.start && i < chars.size(); ++i) {
          if (chars[i].second != st.ch) break;
          start_cut = i + 1;
        }
        size_t stop_cut = chars.size();
        for (size_t i = 0; i < st.stop && i < chars.size(); ++i) {
          size_t idx = chars.size() - i - 1;
          if (chars[idx].second != st.ch) break;
          stop_cut = idx;
        }
        if (stop_cut <= start_cut) {
          tok.clear();
          continue;
        }
        size_t a = chars[start_cut].first;
        size_t b = stop_cut < chars.size() ? chars[stop_cut].first : tok.size();
        tok = tok.substr(a, b - a);
      }
    } else if (t == "Metaspace") {
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string o;
        const std::string& tok = tokens[k];
        for (size_t i = 0; i < tok.size();) {
          size_t a = i;
          char32_t c = utf8_next(tok, i);
          if (c == st.ch) {
            if (!(k == 0 && st.prepend != 2)) o += ' ';
          } else {
            o.append(tok, a, i - a);
          }
        }
        tokens[k] = std::move(o);
      }
    } else if (t == "BPEDecoder") {
      Json pat = {{"String", st.content}};
      Pattern p(pat, "decoder");
      for (size_t k = 0; k < tokens.size(); ++k)
        tokens[k] = p.replace_all(tokens[k], k + 1 == tokens.size() ? "" : " ");
    }
  }
  std::string out;
  for (auto& tok : tokens) out += tok;
  return out;
}

// ---------------------------------------------------------------- post-processors

PostProcessor::PostProcessor(const Json& j,
                             const std::function<std::optional<int32_t>(const std::string&)>& lookup) {
  if (!j.is_null()) add(j, lookup);
}

void PostProcessor::add(const Json& j, const std::function<std::optional<int32_t>(const std::string&)>& lookup) {
  const std::string where = "tokenizer.json post_processor";
  std::string type = json_required<std::string>(j, "type", where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const Json& p : json_required<Json>(j, "processors", where)) add(p, lookup);
    return;
  }
  std::vector<int32_t> pre, post;
  if (type == "TemplateProcessing") {
    const Json& specials = json_required<Json>(j, "special_tokens", where);
    bool seen_a = false;
    for (const Json& item : json_required<Json>(j, "single", where)) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken")) fail(where, ": template item is neither SpecialToken nor Sequence");
      std::string name = json_required<std::string>(item["SpecialToken"], "id", where);
      auto it = specials.find(name);
      if (it == specials.end()) fail(where, ": template uses \"", name, "\" missing from special_tokens");
      for (const Json& id : json_required<Json>(*it, "ids", where)) (seen_a ? post : pre).push_back(id.get<int32_t>());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) {
      const Json& pair = json_required<Json>(j, key, where);
      if (!pair.is_array() || pair.size() != 2) fail(where, ": \"", key, "\" must be [token, id]");
      return pair[1].get<int32_t>();
    };
    pre.push_back(id_of("cls"));
    post.push_back(id_of("sep"));
  } else {
    fail(where, ": post-processor type \"", type, "\" is not supported");
  }
  (void)lookup;
  // A later processor wraps the result of the earlier ones.
  prefix_.insert(prefix_.begin(), pre.begin(), pre.end());
  suffix_.insert(suffix_.end(), post.begin(), post.end());
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  if (!prefix_.empty()) ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
}

}  // namespace astrai::tokenizer
