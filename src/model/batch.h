// The one input format of the forward pass, shared by scoring, the inference engine and
// the trainer: a packed ragged batch. Sequences are concatenated with no padding; each
// has its own positions and attends causally to itself only.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace astrai::model {

// One sequence's share of a step.
struct SeqSpan {
  int32_t token_begin = 0;  // first of this sequence's new tokens in Batch::tokens
  int32_t num_tokens = 0;   // new tokens this step (a prefill chunk, or 1 when decoding)
  // Tokens of this sequence already in the KV cache before this step. New token j sits at
  // sequence index context_len + j and attends to indices [0, context_len + j].
  // Must be 0 when the forward runs without a KV cache.
  int32_t context_len = 0;
  // Paged mode only: page ids covering sequence indices [0, context_len + num_tokens);
  // index i lives in page page_table[i / page_size], slot i % page_size.
  std::vector<int32_t> page_table;
};

struct Batch {
  std::vector<int32_t> tokens;     // all new tokens, sequence after sequence
  std::vector<int32_t> positions;  // RoPE position of each token (its own, per sequence)
  std::vector<SeqSpan> seqs;
  // Rows of `tokens` whose logits are wanted, in output order; empty means every row.
  std::vector<int32_t> logit_rows;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }

  // Appends a sequence of new tokens whose positions run context_len, context_len+1, ...
  void add_sequence(const std::vector<int32_t>& ids, int32_t context_len = 0,
                    std::vector<int32_t> page_table = {}) {
    SeqSpan span;
    span.token_begin = num_tokens();
    span.num_tokens = static_cast<int32_t>(ids.size());
    span.context_len = context_len;
    span.page_table = std::move(page_table);
    for (size_t j = 0; j < ids.size(); ++j) {
      tokens.push_back(ids[j]);
      positions.push_back(context_len + static_cast<int32_t>(j));
    }
    seqs.push_back(std::move(span));
  }
};

// Storage of a paged KV cache, owned by the inference engine; the layout is fixed here so
// the attention kernel can read K/V through page tables without gathering.
// Layer l, page p, kv head h, slot s: element ((p * num_kv_heads + h) * page_size + s) * k_head_dim
// of k_pages[l] (the same for v with v_head_dim): head-major, so attention streams one head's
// rows of a page as one contiguous block. Elements are f32, or bf16 (K/V rounded to nearest
// even when written: half the memory and half the bytes each decode step reads).
struct PagedKv {
  int32_t page_size = 16;
  int32_t num_kv_heads = 0;
  int32_t k_head_dim = 0;
  int32_t v_head_dim = 0;
  DType dtype = DType::kF32;  // kF32 or kBF16
  std::vector<void*> k_pages;  // one base pointer per layer
  std::vector<void*> v_pages;
};

}  // namespace astrai::model
