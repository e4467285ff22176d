#include "tokenizer/stream_decoder.h"


namespace astrai::tokenizer {

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

void StreamDecoder::reset() {
  window_.clear();
  context_ = 0;
  context_text_.clear();
}

std::string StreamDecoder::step(int32_t id) {
  window_.push_back(id);
  std::string text = tokenizer_.decode(window_, skip_special_);
  size_t pending = window_.size() - context_;
  bool incomplete = ends_with_replacement(text) && pending <= kMaxPending;
  // Tokens that add no text (skipped specials, a lone SentencePiece "▁") wait for the
  // next one, but never more than kMaxPending so the window stays small.
  if ((text.size() <= context_text_.size() && pending <= kMaxPending) || incomplete) return {};
  std::string delta;
  if (text.size() >= context_text_.size() && text.compare(0, context_text_.size(), context_text_) == 0) {
    delta = text.substr(context_text_.size());
  } else {
    // The decoder rewrote already emitted text: a byte-fallback run that is invalid
    // UTF-8 as a whole turns every byte into U+FFFD, including bytes of characters
    // shown earlier. Emitted text cannot be taken back; show the pending tokens alone.
    delta = tokenizer_.decode(std::span<const int32_t>(window_).subspan(context_), skip_special_);
  }
  // The tokens just emitted become the context of the next step.
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(context_));
  context_ = window_.size();
  context_text_ = tokenizer_.decode(window_, skip_special_);
  return delta;
}

std::string StreamDecoder::step(std::span<const int32_t> ids) {
  std::string out;
  for (int32_t id : ids) out += step(id);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (window_.size() > context_) {
    std::string text = tokenizer_.decode(window_, skip_special_);
    if (text.size() > context_text_.size() && text.compare(0, context_text_.size(), context_text_) == 0)
      out = text.substr(context_text_.size());
  }
  reset();
  return out;
}

}  // namespace astrai::tokenizer
