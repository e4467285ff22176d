// UTF-8 helpers and the Unicode character classes Hugging Face `tokenizers` relies on
// (Rust's char::is_whitespace / \w, NFC/NFKC through ICU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace astrai::tokenizer {

// Byte length of the UTF-8 sequence that starts with `lead` (1 for invalid leads, so a
// scan always advances).
inline size_t utf8_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i.
char32_t utf8_next(std::string_view s, size_t& i);
// Decodes the last code point before s[end] (valid UTF-8); returns its start via `start`.
char32_t utf8_prev(std::string_view s, size_t end, size_t* start);
void utf8_append(std::string& out, char32_t cp);

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t utf8_invalid_offset(std::string_view s);
// Rust's String::from_utf8_lossy (= WHATWG TextDecoder): each maximal invalid subpart
// becomes one U+FFFD.
std::string utf8_lossy(std::string_view s);
// Length of the longest suffix of s that is an incomplete (but so far valid) UTF-8
// sequence: 0 when s ends on a character boundary.
size_t utf8_incomplete_tail(std::string_view s);

// Rust char::is_whitespace (Unicode White_Space).
bool is_white_space(char32_t c);
// General category ("Lu", ...) as HF's Oniguruma / Rust regex (Unicode 16) see it;
// nullptr for unassigned code points.
const char* general_category16(char32_t c);
// Rust regex \w (Alphabetic, M, Nd, Pc, Join_Control).
bool is_word_char(char32_t c);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::string unicode_normalize(std::string_view s, NormalForm form);
std::string unicode_lowercase(std::string_view s);

}  // namespace astrai::tokenizer
