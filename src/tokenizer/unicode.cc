#include "tokenizer/unicode.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "base/error.h"

namespace astrai::tokenizer {

char32_t utf8_next(std::string_view s, size_t& i) {
  uint8_t c = static_cast<uint8_t>(s[i]);
  size_t n = utf8_len(c);
  if (n == 1 || i + n > s.size()) {
    ++i;
    return c;
  }
  char32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

char32_t utf8_prev(std::string_view s, size_t end, size_t* start) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80 && end - b < 4) --b;
  size_t i = b;
  char32_t cp = utf8_next(s, i);
  if (start) *start = b;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {
// Length of the valid sequence at s[i], or 0 with *subpart = length of the maximal
// invalid subpart (Unicode "maximal subpart" rule, as Rust and WHATWG use).
size_t valid_seq(std::string_view s, size_t i, size_t* subpart) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n = s.size();
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= n) break;
    uint8_t x = b(i + k);
    uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) break;
  }
  if (k == need + 1) return need + 1;
  *subpart = k;
  return 0;
}
}  // namespace

size_t utf8_invalid_offset(std::string_view s) {
  size_t i = 0, sub = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = valid_seq(s, i, &sub);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, sub = 0;
  while (i < s.size()) {
    size_t len = valid_seq(s, i, &sub);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += sub;
    }
  }
  return out;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A tail is incomplete when a lead byte within the last 3 bytes announces more
  // continuation bytes than follow, and the bytes so far form a valid prefix.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t c = static_cast<uint8_t>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;
    size_t need = utf8_len(c);
    if (need <= back || c < 0xC2 || c > 0xF4) return 0;
    size_t sub = 0;
    // Valid prefix iff the maximal subpart reaches the end of the string.
    if (valid_seq(s, n - back, &sub) == 0 && sub == back) return back;
    return 0;
  }
  return 0;
}

bool is_white_space(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

const char* general_category16(char32_t c) {
  struct Range {
    uint32_t first, last;
    const char* gc;
  };
  static const Range kTable[] = {
#include "tokenizer/unicode_gc.inc"
  };
  size_t lo = 0, hi = sizeof kTable / sizeof kTable[0];
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (kTable[mid].last < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < sizeof kTable / sizeof kTable[0] && kTable[lo].first <= c ? kTable[lo].gc : nullptr;
}

bool is_word_char(char32_t c) {
  UChar32 u = static_cast<UChar32>(c);
  UVersionInfo age;
  u_charAge(u, age);
  if (age[0] == 0) {
    // Unknown to ICU 72 (Unicode 15.0) but maybe assigned in Rust regex's Unicode 16.
    const char* gc = general_category16(c);
    if (!gc) return false;
    return gc[0] == 'L' || gc[0] == 'M' || (gc[0] == 'N' && gc[1] == 'd') || (gc[0] == 'P' && gc[1] == 'c');
  }
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL)) return true;
  int8_t t = u_charType(u);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

namespace {
// HF normalizes with unicode-normalization-alignments 0.1.12, whose tables are Unicode
// 9.0: a character assigned later has no decomposition, combining class 0 and composes
// with nothing, i.e. it is a barrier. Canonical stability makes ICU's result on runs of
// Unicode <= 9 characters equal to the 9.0 tables', so runs are normalized separately.
bool after_unicode9(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  return age[0] == 0 || age[0] > 9;
}
std::string icu_normalize(std::string_view s, NormalForm form);
}  // namespace

std::string unicode_normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char ch : s) {
    if (static_cast<uint8_t>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);
  std::string out;
  size_t run = 0, i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = utf8_next(s, i);
    if (c >= 0x80 && after_unicode9(c)) {
      out += icu_normalize(s.substr(run, start - run), form);
      out.append(s.substr(start, i - start));
      run = i;
    }
  }
  out += icu_normalize(s.substr(run), form);
  return out;
}

namespace {
std::string icu_normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (char ch : s) {
    if (static_cast<uint8_t>(ch) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);  // ASCII is invariant under every normal form
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = nullptr;
  switch (form) {
    case NormalForm::kNFC: norm = icu::Normalizer2::getNFCInstance(err); break;
    case NormalForm::kNFD: norm = icu::Normalizer2::getNFDInstance(err); break;
    case NormalForm::kNFKC: norm = icu::Normalizer2::getNFKCInstance(err); break;
    case NormalForm::kNFKD: norm = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err)) fail("tokenizer: ICU normalizer unavailable: ", u_errorName(err));
  icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  icu::UnicodeString out = norm->normalize(in, err);
  if (U_FAILURE(err)) fail("tokenizer: ICU normalization failed: ", u_errorName(err));
  std::string result;
  out.toUTF8String(result);
  return result;
}
}  // namespace

namespace {
char32_t lower_char(char32_t c) {
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(c), age);
  if (age[0] != 0) return static_cast<char32_t>(u_tolower(static_cast<UChar32>(c)));
  // Newer than ICU 72: Node-generated table (HF's Rust std knows these scripts).
  static const std::pair<uint32_t, uint32_t> kLower[] = {
#include "tokenizer/unicode_lower.inc"
  };
  auto it = std::lower_bound(std::begin(kLower), std::end(kLower), std::pair<uint32_t, uint32_t>(c, 0));
  return it != std::end(kLower) && it->first == c ? it->second : c;
}
}  // namespace

std::string unicode_lowercase(std::string_view s) {
  // HF lowercases char by char (Rust char::to_lowercase): full mappings but no context,
  // so a final capital sigma becomes σ, not ς. Only U+0130 maps to more than one char.
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c = utf8_next(s, i);
    if (c < 0x80) {
      out += (c >= 'A' && c <= 'Z') ? char(c + 32) : char(c);
    } else if (c == 0x130) {
      out += "i\xCC\x87";
    } else {
      utf8_append(out, lower_char(c));
    }
  }
  return out;
}

}  // namespace astrai::tokenizer
