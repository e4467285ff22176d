// ZeRO-1 (`--shard-optimizer`): which rank owns which slice of the flat parameter buffer, and
// the gradient blocks the global norm is summed over.
//
// The buffer (params.h: every tensor at a 16-float aligned offset) is cut into blocks: each
// tensor into pieces of at most kNormBlock floats, so a tensor boundary is always a block
// boundary. The squared gradient norm is a double per block, summed in block order; that sum
// is the same float whether one rank computed every block or each rank computed its own and
// the partials were gathered (grad_norm_from_blocks). A shard is a run of whole blocks, so the
// ranks' shares of the norm, the clipping, AdamW and its moments never straddle a rank.
//
// Rank r owns the floats [begin(r), end(r)): begin(0) = 0, end(r) = begin(r + 1), end of the
// last rank = the buffer's size (the alignment padding goes with the block before it), so the
// ranks' slices tile the buffer (what the all-gather of the weights moves). The cuts are chosen
// so that every rank holds about total / ranks floats of parameters (as close as whole blocks
// allow; with fewer blocks than ranks some ranks own nothing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "train/params.h"

namespace astrai::train {

// Gradient-norm block size in floats (also the granularity of a shard).
inline constexpr size_t kNormBlock = size_t{1} << 16;

// Floats [begin, end) of the buffer; end - begin <= kNormBlock.
using Block = backend::FloatRange;

// The blocks of every tensor in `specs` (buffer order), each tensor cut into pieces of at most
// `block` floats.
std::vector<Block> param_blocks(const std::vector<ParamSpec>& specs, size_t block = kNormBlock);

class ShardPlan {
 public:
  // `total`: the buffer's size in floats (>= the end of the last spec). ranks >= 1.
  ShardPlan(const std::vector<ParamSpec>& specs, size_t total, int ranks, size_t block = kNormBlock);

  int ranks() const { return ranks_; }
  size_t total() const { return total_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  // Blocks [first_block(r), first_block(r + 1)) belong to rank r.
  size_t first_block(int r) const { return first_block_[static_cast<size_t>(r)]; }
  // The floats rank r owns: [begin(r), end(r)).
  size_t begin(int r) const { return bounds_[static_cast<size_t>(r)]; }
  size_t end(int r) const { return bounds_[static_cast<size_t>(r) + 1]; }
  size_t size(int r) const { return end(r) - begin(r); }
  // ranks + 1 offsets: bounds()[r] = begin(r), bounds().back() = total().
  const std::vector<size_t>& bounds() const { return bounds_; }
  // Parameters (not padding) rank r owns.
  size_t owned_params(int r) const;

 private:
  int ranks_;
  size_t total_;
  std::vector<Block> blocks_;
  std::vector<size_t> first_block_;  // ranks + 1
  std::vector<size_t> bounds_;       // ranks + 1
};

// Squared L2 norm (double) of the gradient in each of blocks [first, last) of `blocks`, into
// out[first .. last) (host memory; the other entries untouched). The same value for any
// thread count. `grads` is in the memory of `ops`.
void block_sq_norms(const float* grads, const std::vector<Block>& blocks, size_t first, size_t last, double* out,
                    const backend::Ops& ops = backend::cpu_ops());

// sqrt of the partials summed in block order.
double grad_norm_from_blocks(const std::vector<double>& partials);

// The clip coefficient torch.nn.utils.clip_grad_norm_ applies for `norm` (1 when no clipping:
// max_norm <= 0, the norm within it, or not finite), and scaling of grads[begin, end) by it.
float clip_coefficient(double norm, double max_norm);
void scale_grads(float* grads, size_t begin, size_t end, float coef, const backend::Ops& ops = backend::cpu_ops());

}  // namespace astrai::train
