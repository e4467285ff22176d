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
  emitted_ = 0;
}

std::string StreamDecoder::step(int32_t id) {
  window_.push_back(id);
  std::string text = tokenizer_.decode(window_, skip_special_);
  size_t pending = window_.size() - context_;
  auto advance = [&] {
    // The tokens just emitted become the context of the next step.
    window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(context_));
    context_ = window_.size();
    context_text_ = tokenizer_.decode(window_, skip_special_);
    emitted_ = 0;
  };
  // Text ending in U+FFFD may end in an incomplete character (ByteLevel decodes it to
  // one U+FFFD, ByteFallback turns its whole byte run, context included, into U+FFFD),
  // so nothing is final until it ends otherwise; after kForceAdvance tokens (real
  // U+FFFD) it is shown anyway.
  if (ends_with_replacement(text) && pending <= kForceAdvance) return {};
  if (text.size() < context_text_.size() || text.compare(0, context_text_.size(), context_text_) != 0) {
    // The decoder rewrote already emitted text: a byte-fallback run that is invalid
    // UTF-8 as a whole turns every byte into U+FFFD, including bytes of characters
    // shown earlier. Emitted text cannot be taken back; show the pending tokens alone.
    std::string delta = tokenizer_.decode(std::span<const int32_t>(window_).subspan(context_), skip_special_);
    delta = emitted_ < delta.size() ? delta.substr(emitted_) : std::string();
    advance();
    return delta;
  }
  size_t avail = text.size() - context_text_.size();
  if (avail == 0) {
    // Tokens that add no text (skipped specials, a lone SentencePiece "▁") wait for the
    // next one, but never more than kMaxPending so the window stays small.
    if (pending > kMaxPending) advance();
    return {};
  }
  size_t ready = avail;
  std::string delta;
  if (ready > emitted_) {
    delta = text.substr(context_text_.size() + emitted_, ready - emitted_);
    emitted_ = ready;
  }
  advance();
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
    if (text.size() > context_text_.size() + emitted_ &&
        text.compare(0, context_text_.size(), context_text_) == 0)
      out = text.substr(context_text_.size() + emitted_);
  }
  reset();
  return out;
}

}  // namespace astrai::tokenizer
