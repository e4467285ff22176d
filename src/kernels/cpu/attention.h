// Causal attention of the inference forward over a packed ragged batch, reading K/V either
// from the batch's own rows (no cache) or through per-sequence page tables (paged cache),
// without gathering them into a contiguous copy.
//
// Batch invariance: the output of (token, head) is computed by the same operations in the
// same order whatever the other sequences, the chunking of the prefill, the page size or the
// K/V source. Key positions go in chunks of 64 fixed by position (0-63, 64-127, ...); per
// chunk, in increasing position order: the scores, the running max and the exponentials
// with a fixed-order sum (the V accumulators and the sum rescaled when the max grew, an
// online softmax), then the exponential-weighted sum of V rows; the output is that sum
// divided by the total once the last chunk is done.
#pragma once

#include <cstdint>
#include <vector>

namespace astrai::kernels {

struct AttentionDims {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // query head h reads kv head h / (num_heads / num_kv_heads)
  int64_t qk_dim = 0;
  int64_t v_dim = 0;
  float scale = 1.0f;  // applied to q . k
};

struct AttentionSeq {
  int32_t token_begin = 0;  // first new token of the sequence in q/out rows
  int32_t num_tokens = 0;
  int32_t context_len = 0;  // cached positions before the new tokens (paged mode only)
  const int32_t* page_table = nullptr;  // paged mode: page ids for positions [0, context_len + num_tokens)
};

// Where K/V rows live.
//   page_size == 0: k[T, kv_heads, qk_dim], v[T, kv_heads, v_dim] hold the batch's own new
//     tokens; position i of a sequence is row token_begin + i (context_len must be 0).
//   page_size > 0: position i is in page page_table[i / page_size], slot i % page_size, and
//     pages are head-major: k + ((page * kv_heads + h) * page_size + slot) * qk_dim, so one
//     head's rows of a page are contiguous (the same for v with v_dim).
// Rows are f32, or bf16 when bf16 is set (the engine's paged cache can store K/V
// in bf16, half the bytes each decode step streams; a bf16 value widens to f32 exactly, so
// the result equals the f32 run over the same, rounded, rows).
struct KvSource {
  const void* k = nullptr;
  const void* v = nullptr;
  int32_t page_size = 0;
  bool bf16 = false;
};

// Scratch reused across calls: per-thread score and accumulator buffers and the work list,
// grown on demand outside the parallel region.
struct AttentionScratch {
  struct Block {
    int32_t seq, token, count;  // tokens [token, token + count) of sequence seq
  };
  std::vector<float> buf;
  std::vector<const float*> qrows;  // per thread: the query rows of its work item
  std::vector<Block> blocks;
  // Prefill on v3 and v4: each long enough sequence's K transposed once per call, [kv head][chunk of 64
  // positions][qk dim][64] f32 at kt_at[seq] in kt (-1: not transposed); kt_jobs lists the
  // (sequence, kv head, chunk) transpositions of the call.
  struct KtJob {
    int32_t seq, head, chunk;
  };
  std::vector<float> kt;
  std::vector<int64_t> kt_at;
  std::vector<KtJob> kt_jobs;
};

// q [T, num_heads, qk_dim], out [T, num_heads, v_dim]. Rows of tokens not covered by a
// sequence are left untouched. Up to 4 consecutive tokens of a sequence are computed together
// (they share each K/V row read); every output is still computed by the same operations as if
// its token were alone.
// lse, if given, receives [T, num_heads] log-sum-exp of each row's scaled scores (training
// saves it for the backward).
void attention(const float* q, const KvSource& kv, const AttentionSeq* seqs, int64_t num_seqs,
               const AttentionDims& d, float* out, AttentionScratch& scratch, float* lse = nullptr);

}  // namespace astrai::kernels
