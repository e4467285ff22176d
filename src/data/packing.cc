#include "data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "base/error.h"

namespace astrai::data {

Packing parse_packing(std::string_view name) {
  if (name == "none") return Packing::kNone;
  if (name == "simple") return Packing::kSimple;
  if (name == "bfd" || name == "best-fit" || name == "best_fit_decreasing") return Packing::kBestFit;
  fail("unknown packing \"", std::string(name), "\" (expected none, simple or bfd)");
}

std::string_view packing_name(Packing p) {
  switch (p) {
    case Packing::kNone: return "none";
    case Packing::kSimple: return "simple";
    case Packing::kBestFit: return "bfd";
  }
  return "?";
}

std::vector<std::vector<int64_t>> best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity) {
  ASTRAI_CHECK(capacity > 0, "best_fit_decreasing: capacity must be positive");
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> bins;
  // Open bins by remaining space; lower_bound(len) is the tightest bin that fits. Ties by
  // bin index keep the choice deterministic.
  std::multimap<int64_t, int64_t> by_space;
  for (int64_t item : order) {
    const int64_t len = lengths[item];
    ASTRAI_CHECK(len >= 0 && len <= capacity, "best_fit_decreasing: item of length ", len,
                 " does not fit capacity ", capacity);
    auto it = by_space.lower_bound(len);
    int64_t bin;
    int64_t space;
    if (it == by_space.end()) {
      bin = static_cast<int64_t>(bins.size());
      bins.emplace_back();
      space = capacity;
    } else {
      bin = it->second;
      space = it->first;
      by_space.erase(it);
    }
    bins[bin].push_back(item);
    space -= len;
    if (space > 0) by_space.emplace(space, bin);
  }
  return bins;
}

Packer::Packer(Packing mode, int64_t row_len, int32_t pad_id, Emit emit, int64_t buffer_tokens)
    : mode_(mode), row_len_(row_len), pad_id_(pad_id), emit_(std::move(emit)), buffer_tokens_(buffer_tokens) {
  ASTRAI_CHECK(mode_ == Packing::kNone || row_len_ >= 2, "packing: row length must be at least 2, got ", row_len_);
  ASTRAI_CHECK(buffer_tokens_ > 0, "packing: buffer size must be positive");
}

void Packer::append_piece(PackedRow& row, std::span<const int32_t> tokens, std::span<const uint8_t> mask) {
  row.tokens.insert(row.tokens.end(), tokens.begin(), tokens.end());
  if (mask.empty()) {
    row.loss_mask.insert(row.loss_mask.end(), tokens.size(), 1);
  } else {
    row.loss_mask.insert(row.loss_mask.end(), mask.begin(), mask.end());
  }
  for (size_t i = 0; i < tokens.size(); ++i) row.position_ids.push_back(static_cast<int32_t>(i));
}

void Packer::emit_row(PackedRow& row) {
  if (mode_ != Packing::kNone) {
    const int64_t pad = row_len_ - static_cast<int64_t>(row.tokens.size());
    for (int64_t i = 0; i < pad; ++i) {
      row.tokens.push_back(pad_id_);
      row.loss_mask.push_back(0);
      row.position_ids.push_back(static_cast<int32_t>(i));
    }
    stats_.padding += pad;
  }
  ++stats_.rows;
  emit_(row);
  row.tokens.clear();
  row.loss_mask.clear();
  row.position_ids.clear();
}

void Packer::add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask) {
  ASTRAI_CHECK(loss_mask.empty() || loss_mask.size() == tokens.size(), "packing: loss mask has ", loss_mask.size(),
               " entries for ", tokens.size(), " tokens");
  if (tokens.empty()) return;
  ++stats_.documents;
  stats_.tokens += static_cast<int64_t>(tokens.size());
  const auto n = static_cast<int64_t>(tokens.size());
  auto mask_of = [&](int64_t b, int64_t e) {
    return loss_mask.empty() ? std::span<const uint8_t>() : loss_mask.subspan(b, e - b);
  };
  switch (mode_) {
    case Packing::kNone: {
      append_piece(current_, tokens, loss_mask);
      emit_row(current_);
      return;
    }
    case Packing::kSimple: {
      int64_t done = 0;
      if (n > row_len_ - static_cast<int64_t>(current_.tokens.size())) ++stats_.split_documents;
      while (done < n) {
        const int64_t space = row_len_ - static_cast<int64_t>(current_.tokens.size());
        const int64_t take = std::min(space, n - done);
        append_piece(current_, tokens.subspan(done, take), mask_of(done, done + take));
        done += take;
        if (static_cast<int64_t>(current_.tokens.size()) == row_len_) emit_row(current_);
      }
      return;
    }
    case Packing::kBestFit: {
      // Whole rows of an over-long document are emitted at once; only the remainder joins
      // the buffer, so no document that fits a row is ever split.
      int64_t done = 0;
      if (n > row_len_) ++stats_.split_documents;
      while (n - done > row_len_) {
        PackedRow row;
        append_piece(row, tokens.subspan(done, row_len_), mask_of(done, done + row_len_));
        emit_row(row);
        done += row_len_;
      }
      if (done < n) {
        Piece p;
        p.tokens.assign(tokens.begin() + done, tokens.end());
        if (!loss_mask.empty()) p.loss_mask.assign(loss_mask.begin() + done, loss_mask.end());
        buffered_ += n - done;
        buffer_.push_back(std::move(p));
      }
      if (buffered_ >= buffer_tokens_) pack_buffer();
      return;
    }
  }
}

void Packer::pack_buffer() {
  if (buffer_.empty()) return;
  std::vector<int64_t> lengths(buffer_.size());
  for (size_t i = 0; i < buffer_.size(); ++i) lengths[i] = static_cast<int64_t>(buffer_[i].tokens.size());
  const auto bins = best_fit_decreasing(lengths, row_len_);
  PackedRow row;
  for (const auto& bin : bins) {
    for (int64_t item : bin) append_piece(row, buffer_[item].tokens, buffer_[item].loss_mask);
    emit_row(row);
  }
  buffer_.clear();
  buffered_ = 0;
}

void Packer::flush() {
  if (mode_ == Packing::kBestFit) pack_buffer();
  if (mode_ == Packing::kSimple && !current_.tokens.empty()) emit_row(current_);
}

}  // namespace astrai::data
