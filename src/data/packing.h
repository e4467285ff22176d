// Packing documents into fixed-length rows.
//
// Invariants of every packed row (checked by the tests):
//   - every token of every document appears exactly once, in document order within a piece;
//   - position ids restart at 0 at the start of each document piece, and run 0, 1, 2, ...
//     inside it, so the trainer can recover piece boundaries from position_ids == 0 and never
//     lets packed documents attend to each other;
//   - padding (pad id, loss_mask 0) only at the end of a row, as its own segment (positions
//     restart at 0 there too).
// A document longer than a row is split into pieces; a piece that starts a row mid-document
// is treated as a new document (positions from 0), so positions never exceed the row length.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace astrai::data {

enum class Packing {
  kNone,     // one record per document, no padding
  kSimple,   // concatenate documents in order and cut into rows
  kBestFit,  // best-fit decreasing: whole documents into the fullest row they fit
};

Packing parse_packing(std::string_view name);  // "none" | "simple" | "bfd"
std::string_view packing_name(Packing p);

struct PackedRow {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<int32_t> position_ids;
};

struct PackingStats {
  int64_t documents = 0;
  int64_t tokens = 0;       // document tokens (no padding)
  int64_t rows = 0;
  int64_t padding = 0;      // pad tokens emitted
  int64_t split_documents = 0;  // documents cut into more than one piece
};

// Best-fit decreasing bin packing: items (lengths <= capacity) in order of decreasing length
// (ties by index, so the result is deterministic) go to the open bin with the least space
// that still fits them, else to a new bin. Returns, per bin, the item indices in placement
// order. Uses at most 11/9 OPT + 6/9 bins.
std::vector<std::vector<int64_t>> best_fit_decreasing(std::span<const int64_t> lengths, int64_t capacity);

// Streams documents into rows of `row_len` tokens and hands each finished row to `emit`.
// In kBestFit mode documents are buffered until `buffer_tokens` tokens are waiting, then the
// buffer is packed as a whole (memory stays bounded on large corpora). kNone emits each
// document as its own unpadded row.
class Packer {
 public:
  using Emit = std::function<void(const PackedRow&)>;
  Packer(Packing mode, int64_t row_len, int32_t pad_id, Emit emit, int64_t buffer_tokens = int64_t{1} << 24);

  // loss_mask may be empty (every token counts) or as long as tokens.
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask = {});
  // Packs whatever is buffered and pads the last partial row. Call once at the end.
  void flush();
  const PackingStats& stats() const { return stats_; }

 private:
  struct Piece {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> loss_mask;
  };
  void emit_row(PackedRow& row);
  void append_piece(PackedRow& row, std::span<const int32_t> tokens, std::span<const uint8_t> mask);
  void pack_buffer();

  Packing mode_;
  int64_t row_len_;
  int32_t pad_id_;
  Emit emit_;
  int64_t buffer_tokens_;
  PackingStats stats_;
  PackedRow current_;           // kSimple: the row being filled
  std::vector<Piece> buffer_;   // kBestFit: pieces waiting to be packed
  int64_t buffered_ = 0;
};

}  // namespace astrai::data
