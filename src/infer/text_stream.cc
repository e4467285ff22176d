#include "infer/text_stream.h"

#include <algorithm>

namespace astrai::infer {
namespace {
const char kReplacement[] = "\xEF\xBF\xBD";

// Length of the sequence a lead byte starts (0 if it is not a valid lead byte).
int lead_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Whether byte k (1-based continuation index) is allowed after lead byte `lead`.
bool continuation_ok(unsigned char lead, int k, unsigned char c) {
  if ((c & 0xC0) != 0x80) return false;
  if (k != 1) return true;
  if (lead == 0xE0) return c >= 0xA0;
  if (lead == 0xED) return c <= 0x9F;  // no surrogates
  if (lead == 0xF0) return c >= 0x90;
  if (lead == 0xF4) return c <= 0x8F;
  return true;
}
}  // namespace

size_t utf8_sanitize_append(std::string_view in, std::string* out) {
  size_t i = 0;
  while (i < in.size()) {
    const unsigned char c = in[i];
    const int len = lead_length(c);
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    int k = 1;
    while (k < len && i + k < in.size() && continuation_ok(c, k, in[i + k])) ++k;
    if (k == len) {
      out->append(in.substr(i, len));
      i += len;
    } else if (i + k == in.size()) {
      return in.size() - i;  // unfinished but still valid: wait for more bytes
    } else {
      out->append(kReplacement);  // broken sequence: replace the bytes read so far
      i += k;
    }
  }
  return 0;
}

TextStream::TextStream(std::vector<std::string> stop_strings) : stops_(std::move(stop_strings)) {
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string TextStream::push(std::string_view bytes, bool* stopped) {
  *stopped = false;
  if (done_) return {};
  raw_tail_.append(bytes);
  const size_t before = held_.size();
  const size_t keep = utf8_sanitize_append(raw_tail_, &held_);
  raw_tail_.erase(0, raw_tail_.size() - keep);
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // A match must end in the new text; it may start up to max_stop_-1 bytes before it.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
  for (const auto& s : stops_) {
    const size_t pos = held_.find(s, from);
    if (pos != std::string::npos && pos < best) best = pos, best_stop = &s;
  }
  if (best_stop) {
    *stopped = true;
    done_ = true;
    matched_ = *best_stop;
    std::string out = held_.substr(0, best);
    held_.clear();
    raw_tail_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string TextStream::flush() {
  if (done_) return {};
  done_ = true;
  std::string out;
  out.swap(held_);
  if (!raw_tail_.empty()) out.append(kReplacement);
  raw_tail_.clear();
  return out;
}

}  // namespace astrai::infer
