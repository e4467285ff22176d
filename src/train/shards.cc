#include "train/shards.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace astrai::train {

std::vector<Block> param_blocks(const std::vector<ParamSpec>& specs, size_t block) {
  ASTRAI_CHECK(block > 0, "param_blocks: block size 0");
  std::vector<Block> out;
  for (const ParamSpec& s : specs)
    for (size_t b = s.offset; b < s.offset + s.numel; b += block)
      out.push_back({b, std::min(b + block, s.offset + s.numel)});
  return out;
}

ShardPlan::ShardPlan(const std::vector<ParamSpec>& specs, size_t total, int ranks, size_t block)
    : ranks_(ranks), total_(total), blocks_(param_blocks(specs, block)) {
  ASTRAI_CHECK(ranks >= 1, "ShardPlan: ranks must be >= 1, got ", ranks);
  for (size_t i = 1; i < blocks_.size(); ++i)
    ASTRAI_CHECK(blocks_[i].begin >= blocks_[i - 1].end, "ShardPlan: parameters out of buffer order");
  ASTRAI_CHECK(blocks_.empty() || blocks_.back().end <= total, "ShardPlan: parameters past the buffer's end");
  // before[i]: parameter floats in blocks [0, i).
  std::vector<size_t> before(blocks_.size() + 1, 0);
  for (size_t i = 0; i < blocks_.size(); ++i) before[i + 1] = before[i] + (blocks_[i].end - blocks_[i].begin);
  const size_t params = before.back();
  first_block_.assign(static_cast<size_t>(ranks) + 1, blocks_.size());
  first_block_[0] = 0;
  // Cut k goes at the block boundary nearest to k/ranks of the parameters (never before cut k-1).
  for (int k = 1; k < ranks; ++k) {
    const double target = static_cast<double>(params) * k / ranks;
    size_t i = first_block_[static_cast<size_t>(k) - 1];
    while (i < blocks_.size() && static_cast<double>(before[i + 1]) <= target) ++i;
    // before[i] <= target < before[i + 1] (or i == blocks): take the nearer of i and i + 1.
    if (i < blocks_.size() && static_cast<double>(before[i + 1]) - target < target - static_cast<double>(before[i])) ++i;
    first_block_[static_cast<size_t>(k)] = i;
  }
  bounds_.assign(static_cast<size_t>(ranks) + 1, total);
  bounds_[0] = 0;
  for (int k = 1; k < ranks; ++k) {
    const size_t b = first_block_[static_cast<size_t>(k)];
    bounds_[static_cast<size_t>(k)] = b < blocks_.size() ? blocks_[b].begin : total;
  }
}

size_t ShardPlan::owned_params(int r) const {
  size_t n = 0;
  for (size_t b = first_block(r); b < first_block(r + 1); ++b) n += blocks_[b].end - blocks_[b].begin;
  return n;
}

void block_sq_norms(const float* grads, const std::vector<Block>& blocks, size_t first, size_t last, double* out,
                    const backend::Ops& ops) {
  if (first < last) ops.sum_squares(blocks.data() + first, last - first, grads, out + first);
}

double grad_norm_from_blocks(const std::vector<double>& partials) {
  double total = 0.0;
  for (double s : partials) total += s;
  return std::sqrt(total);
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void scale_grads(float* grads, size_t begin, size_t end, float coef, const backend::Ops& ops) {
  if (coef != 1.0f && begin < end) ops.scale(grads + begin, end - begin, coef);
}

}  // namespace astrai::train
