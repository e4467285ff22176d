// The sampling of one row of logits (backend/sampling.h), written once for the CPU backend and
// the CUDA kernel: a block of threads runs it in phases (Block::each: every thread runs the
// phase's body with its index, then all wait), and everything outside a phase only reads what
// the phases left in Shared. The host runs a block's threads one after another (HostBlock);
// CUDA runs one block of threads per row (DeviceBlock).
//
// Each result is the engine's sampler's (infer/sampler.cc) bit for bit on the same logits:
// every float operation is its operation (no a * b + c that a compiler could fuse), every
// double sum is one of its sums in its order (8 interleaved chains, then a fixed tree, or one
// sequential sum), and the maxima, the top-n list and the candidates' order are exact, so the
// number of threads never changes a bit. The one exception is log() of a double (the lse of
// logprobs), whose last bit may differ between the host's and the device's math library.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/sampling.h"
#include "base/host_device.h"

namespace astrai::backend::sampling {

// ---- exp_approx over float, as every CPU level computes it (kernels/exp_approx.inc) ----
ASTRAI_HOST_DEVICE inline float vfma(float a, float b, float c) { return fmaf(a, b, c); }
ASTRAI_HOST_DEVICE inline float vfnma(float a, float b, float c) { return fmaf(-a, b, c); }
ASTRAI_HOST_DEVICE inline float vmin(float a, float b) { return a < b ? a : b; }
ASTRAI_HOST_DEVICE inline float vmax(float a, float b) { return a > b ? a : b; }
ASTRAI_HOST_DEVICE inline float vfloor(float a) { return floorf(a); }
ASTRAI_HOST_DEVICE inline float vpow2i(float n) {
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
#include "kernels/exp_approx.inc"

// ---- what the engine's sampler (infer/sampler.cc) shares with this file ----
constexpr int kChains = 8;           // interleaved double sums
constexpr int kSteps = 34;           // candidate thresholds 2^-(1 + 3k), k < kSteps, then 0
constexpr int64_t kDrawBlock = 256;  // positions per block of the draw's scan

// The kChains partial sums added in their fixed tree.
ASTRAI_HOST_DEVICE inline double tree8(const double* p) {
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

// The first candidate threshold 2^-(1 + 3k) a weight w in [0, 1] reaches (its binary exponent
// is >= -(1 + 3k)), kSteps when only the threshold 0 does; zero and subnormals count as 2^-127.
ASTRAI_HOST_DEVICE inline int threshold_bucket(float w) {
  uint32_t bits;
  memcpy(&bits, &w, sizeof bits);
  const int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  const int k = e >= -1 ? 0 : (-1 - e + 2) / 3;  // ceil((-1 - e) / 3)
  return k < kSteps ? k : kSteps;
}

// 2^-(1 + 3k), exactly.
ASTRAI_HOST_DEVICE inline float threshold_value(int k) {
  const uint32_t bits = static_cast<uint32_t>(127 - (1 + 3 * k)) << 23;
  float thr;
  memcpy(&thr, &bits, sizeof thr);
  return thr;
}

constexpr int kMaxThreads = 256;  // threads of a block, at most

// What a block's threads share (CUDA: __shared__).
struct Shared {
  float f[kMaxThreads];
  int64_t i[kMaxThreads];
  double chain[kChains];
  double mass[kSteps + 1][kChains];  // [bucket][chain]
  int64_t count[kSteps + 1][kChains];
  float scalar_f;
  int64_t scalar_i;
};

// A row's scratch in the backend's memory: w [vocab], keys [pow2_at_least(vocab)], blocks
// [vocab / kDrawBlock + 1].
struct RowScratch {
  float* w = nullptr;
  uint64_t* keys = nullptr;
  double* blocks = nullptr;
};

ASTRAI_HOST_DEVICE inline int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The host's block: its threads run one after another, phase by phase.
struct HostBlock {
  int threads = 1;
  template <class F>
  void each(F&& f) const {
    for (int t = 0; t < threads; ++t) f(t);
  }
};

// A candidate as one integer: larger weight first, then lower id (weights are >= +0, so their
// bits order as their values).
ASTRAI_HOST_DEVICE inline uint64_t candidate_key(float w, int64_t id) {
  uint32_t bits;
  memcpy(&bits, &w, sizeof bits);
  return (static_cast<uint64_t>(bits) << 32) | (0xffffffffull - static_cast<uint64_t>(id));
}
ASTRAI_HOST_DEVICE inline float key_weight(uint64_t key) {
  const uint32_t bits = static_cast<uint32_t>(key >> 32);
  float w;
  memcpy(&w, &bits, sizeof w);
  return w;
}
ASTRAI_HOST_DEVICE inline int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(0xffffffffull - (key & 0xffffffffull));
}

// max of x[0, n), NaNs skipped, -inf when nothing else (exact: any order gives it).
template <class B>
ASTRAI_HOST_DEVICE float row_max(const B& blk, Shared& sh, const float* x, int64_t n) {
  blk.each([&](int t) {
    float m = -INFINITY;
    for (int64_t i = t; i < n; i += blk.threads) m = x[i] > m ? x[i] : m;
    sh.f[t] = m;
  });
  blk.each([&](int t) {
    if (t != 0) return;
    float m = sh.f[0];
    for (int k = 1; k < blk.threads; ++k) m = sh.f[k] > m ? sh.f[k] : m;
    sh.scalar_f = m;
  });
  return sh.scalar_f;
}

// The sampler's sum8 of x[0, n) in double, counting values below `floor` as 0: chain c adds
// the i = c, c + 8, ... in increasing i, then ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)).
template <class B>
ASTRAI_HOST_DEVICE double row_sum8(const B& blk, Shared& sh, const float* x, int64_t n, float floor) {
  blk.each([&](int t) {
    for (int c = t; c < kChains; c += blk.threads) {
      double s = 0;
      for (int64_t i = c; i < n; i += kChains) s += x[i] >= floor ? x[i] : 0.0f;
      sh.chain[c] = s;
    }
  });
  return tree8(sh.chain);
}

// out[i] = exp_approx((x[i] - shift) * scale), 0 where that argument is below -87 or NaN.
template <class B>
ASTRAI_HOST_DEVICE void shifted_exp(const B& blk, const float* x, int64_t n, float shift, float scale, float* out) {
  blk.each([&](int t) {
    for (int64_t i = t; i < n; i += blk.threads) {
      const float a = (x[i] - shift) * scale;
      const float e = exp_approx(a);
      out[i] = a >= -87.0f ? e : 0.0f;
    }
  });
}

// The first i < n - 1 with x[i] == best, else n - 1 (greedy's token).
template <class B>
ASTRAI_HOST_DEVICE int64_t first_equal(const B& blk, Shared& sh, const float* x, int64_t n, float best) {
  blk.each([&](int t) {
    int64_t first = n;
    for (int64_t i = t; i < n; i += blk.threads)
      if (x[i] == best) {
        first = i;
        break;
      }
    sh.i[t] = first;
  });
  blk.each([&](int t) {
    if (t != 0) return;
    int64_t first = sh.i[0];
    for (int k = 1; k < blk.threads; ++k) first = sh.i[k] < first ? sh.i[k] : first;
    sh.scalar_i = first < n - 1 ? first : n - 1;
  });
  return sh.scalar_i;
}

// The k best of x (value desc, id asc; NaNs never) into ids, best first: k rounds, each the
// best after the last one taken; returns how many there are (fewer than k when the rest are NaN).
template <class B>
ASTRAI_HOST_DEVICE int32_t top_ids(const B& blk, Shared& sh, const float* x, int64_t n, int32_t k, int32_t* ids) {
  float last_v = 0.0f;
  int64_t last_id = -1;  // none taken yet
  for (int32_t r = 0; r < k; ++r) {
    blk.each([&](int t) {
      float bv = 0.0f;
      int64_t bi = -1;
      for (int64_t i = t; i < n; i += blk.threads) {
        const float v = x[i];
        if (!(v == v)) continue;
        if (last_id >= 0 && !(v < last_v || (v == last_v && i > last_id))) continue;
        if (bi < 0 || v > bv) {  // i increases: an equal value keeps the lower id
          bv = v;
          bi = i;
        }
      }
      sh.f[t] = bv;
      sh.i[t] = bi;
    });
    blk.each([&](int t) {
      if (t != 0) return;
      float bv = 0.0f;
      int64_t bi = -1;
      for (int k2 = 0; k2 < blk.threads; ++k2) {
        const int64_t i = sh.i[k2];
        if (i >= 0 && (bi < 0 || sh.f[k2] > bv || (sh.f[k2] == bv && i < bi))) {
          bv = sh.f[k2];
          bi = i;
        }
      }
      sh.scalar_f = bv;
      sh.scalar_i = bi;
    });
    last_v = sh.scalar_f;
    last_id = sh.scalar_i;
    if (last_id < 0) return r;  // every thread read the same: they leave together
    ids[r] = static_cast<int32_t>(last_id);
  }
  return k;
}

// The sampler's draw over all weights: the index i with prefix(i) <= target < prefix(i + 1),
// through sums of blocks of kDrawBlock (each the sum8 of its block), the last block scanned
// one by one; the last token with any weight when target reaches the total.
template <class B>
ASTRAI_HOST_DEVICE int64_t draw_all(const B& blk, Shared& sh, const float* w, int64_t n, double target,
                                    double* blocks) {
  const int64_t full = n > 0 ? (n - 1) / kDrawBlock : 0;  // the blocks b with b + kDrawBlock < n
  blk.each([&](int t) {
    for (int64_t k = t; k < full; k += blk.threads) {
      const float* x = w + k * kDrawBlock;
      double part[kChains] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = 0; i < kDrawBlock; i += kChains)
        for (int c = 0; c < kChains; ++c) part[c] += x[i + c];
      blocks[k] = tree8(part);
    }
  });
  blk.each([&](int t) {
    if (t != 0) return;
    double cum = 0;
    int64_t b = 0;
    for (int64_t k = 0; k < full; ++k, b += kDrawBlock) {
      if (target < cum + blocks[k]) break;
      cum += blocks[k];
    }
    const int64_t end = n < b + kDrawBlock ? n : b + kDrawBlock;
    for (int64_t i = b; i < end; ++i) {
      cum += w[i];
      if (target < cum) {
        sh.scalar_i = i;
        return;
      }
    }
    int64_t last = end - 1;
    while (last > 0 && !(w[last] > 0.0f)) --last;
    sh.scalar_i = last;
  });
  return sh.scalar_i;
}

// The sampler's candidates_threshold: the first 2^-(1 + 3k) (then 0) at which the weights at or
// above it hold at least need_mass and number at least need_count; chain c's buckets add the
// i = c, c + 8, ... in increasing i.
template <class B>
ASTRAI_HOST_DEVICE float candidates_threshold(const B& blk, Shared& sh, const float* w, int64_t n, double need_mass,
                                              int64_t need_count) {
  blk.each([&](int t) {
    for (int c = t; c < kChains; c += blk.threads) {
      for (int k = 0; k <= kSteps; ++k) {
        sh.mass[k][c] = 0;
        sh.count[k][c] = 0;
      }
      for (int64_t i = c; i < n; i += kChains) {
        const int b = threshold_bucket(w[i]);
        sh.mass[b][c] += w[i];
        sh.count[b][c] += 1;
      }
    }
  });
  double cum_mass = 0;
  int64_t cum_count = 0;
  for (int k = 0; k < kSteps; ++k) {
    cum_mass += tree8(sh.mass[k]);
    for (int c = 0; c < kChains; ++c) cum_count += sh.count[k][c];
    if (cum_mass >= need_mass && cum_count >= need_count) return threshold_value(k);
  }
  return 0.0f;
}

// The weights at or above both bounds, as candidate keys in id order into keys; returns how many.
// Each thread takes one contiguous stretch of ids, so the order is the ids' whatever the threads.
template <class B>
ASTRAI_HOST_DEVICE int64_t gather_candidates(const B& blk, Shared& sh, const float* w, int64_t n, float lo1, float lo2,
                                             uint64_t* keys) {
  const int64_t stretch = (n + blk.threads - 1) / blk.threads;
  blk.each([&](int t) {
    int64_t c = 0;
    const int64_t end = (t + 1) * stretch < n ? (t + 1) * stretch : n;
    for (int64_t i = t * stretch; i < end; ++i) c += w[i] >= lo1 && w[i] >= lo2;
    sh.i[t] = c;
  });
  blk.each([&](int t) {
    if (t != 0) return;
    int64_t offset = 0;
    for (int k = 0; k < blk.threads; ++k) {
      const int64_t c = sh.i[k];
      sh.i[k] = offset;
      offset += c;
    }
    sh.scalar_i = offset;
  });
  blk.each([&](int t) {
    int64_t at = sh.i[t];
    const int64_t end = (t + 1) * stretch < n ? (t + 1) * stretch : n;
    for (int64_t i = t * stretch; i < end; ++i)
      if (w[i] >= lo1 && w[i] >= lo2) keys[at++] = candidate_key(w[i], i);
  });
  return sh.scalar_i;
}

// keys[0, count) in decreasing order (bitonic network over a power of two, padded with 0: below
// every candidate).
template <class B>
ASTRAI_HOST_DEVICE void sort_candidates(const B& blk, uint64_t* keys, int64_t count) {
  const int64_t p = pow2_at_least(count);
  blk.each([&](int t) {
    for (int64_t i = count + t; i < p; i += blk.threads) keys[i] = 0;
  });
  for (int64_t k = 2; k <= p; k *= 2)
    for (int64_t j = k / 2; j > 0; j /= 2)
      blk.each([&](int t) {
        for (int64_t i = t; i < p; i += blk.threads) {
          const int64_t l = i ^ j;
          if (l <= i) continue;
          const bool down = (i & k) == 0;  // this half of the merge decreasing
          const uint64_t a = keys[i], b = keys[l];
          if (down ? a < b : a > b) {
            keys[i] = b;
            keys[l] = a;
          }
        }
      });
}

// One row: what infer/sampler.cc's Sampler::sample gives for a row without logit bias or
// penalties. x is the row's raw logits; the draw uses spec.uniform.
template <class B>
ASTRAI_HOST_DEVICE void sample_row(const B& blk, Shared& sh, const float* x, int64_t vocab, const SampleSpec& s,
                                   const RowScratch& sc, SampleResult& out) {
  const float mx = row_max(blk, sh, x, vocab);  // the logprobs', greedy's and the weights' shift
  float lse = 0.0f;
  if (s.top_logprobs >= 0) {
    shifted_exp(blk, x, vocab, mx, 1.0f, sc.w);
    lse = mx + static_cast<float>(log(row_sum8(blk, sh, sc.w, vocab, 0.0f)));
    const int32_t k = top_ids(blk, sh, x, vocab, s.top_logprobs < vocab ? s.top_logprobs : static_cast<int32_t>(vocab),
                              out.top_ids);
    blk.each([&](int t) {
      if (t != 0) return;
      out.num_top = k;
      for (int32_t r = 0; r < k; ++r) out.top_logprobs[r] = x[out.top_ids[r]] - lse;
    });
  }

  int64_t token = 0;
  if (s.temperature == 0.0f) {
    token = first_equal(blk, sh, x, vocab, mx);
  } else {
    const float inv_t = 1.0f / s.temperature;
    shifted_exp(blk, x, vocab, mx, inv_t, sc.w);  // the best -> 1
    const bool need_sort = s.top_k > 0 || s.top_p < 1.0f;
    const float floor_w = s.min_p > 0.0f ? s.min_p : 0.0f;
    if (!need_sort && floor_w == 0.0f) {
      token = draw_all(blk, sh, sc.w, vocab, s.uniform * row_sum8(blk, sh, sc.w, vocab, 0.0f), sc.blocks);
    } else {
      int64_t count = 0;
      if (need_sort) {
        const double total = s.top_p < 1.0f ? row_sum8(blk, sh, sc.w, vocab, 0.0f) : 0.0;  // top-p's alone
        const double need_mass = s.top_p * total;
        const int64_t need_count = s.top_k > 0 ? (s.top_k < vocab ? s.top_k : vocab) : 1;
        const float thr = candidates_threshold(blk, sh, sc.w, vocab, need_mass, need_count);
        count = gather_candidates(blk, sh, sc.w, vocab, thr, floor_w, sc.keys);
        sort_candidates(blk, sc.keys, count);
        if (s.top_k > 0 && count > s.top_k) count = s.top_k;
        if (s.top_p < 1.0f) {
          // The nucleus of what top-k and min-p kept: of every weight at or above min-p
          // without top-k, of the first k with it.
          const double all_kept = floor_w > 0.0f ? row_sum8(blk, sh, sc.w, vocab, floor_w) : total;
          blk.each([&](int t) {
            if (t != 0) return;
            double kept = all_kept;
            if (s.top_k > 0) {
              kept = 0;
              for (int64_t j = 0; j < count; ++j) kept += key_weight(sc.keys[j]);
            }
            double cum = 0;
            int64_t keep = 0;
            while (keep < count) {
              cum += key_weight(sc.keys[keep++]);
              if (cum >= s.top_p * kept) break;
            }
            sh.scalar_i = keep > 1 ? keep : 1;
          });
          count = sh.scalar_i;
        }
      } else {
        count = gather_candidates(blk, sh, sc.w, vocab, floor_w, floor_w, sc.keys);
      }
      // One draw over the candidates, in their order (sorted, or by id).
      blk.each([&](int t) {
        if (t != 0) return;
        if (count == 0) {  // no finite logit at all
          sh.scalar_i = 0;
          return;
        }
        double mass = 0;
        for (int64_t j = 0; j < count; ++j) mass += key_weight(sc.keys[j]);
        const double u = s.uniform * mass;
        double cum = 0;
        int64_t pick = key_id(sc.keys[count - 1]);
        for (int64_t j = 0; j < count; ++j) {
          cum += key_weight(sc.keys[j]);
          if (u < cum) {
            pick = key_id(sc.keys[j]);
            break;
          }
        }
        sh.scalar_i = pick;
      });
      token = sh.scalar_i;
    }
  }
  blk.each([&](int t) {
    if (t != 0) return;
    out.token = static_cast<int32_t>(token);
    if (s.top_logprobs >= 0) out.logprob = x[token] - lse;
  });
}

}  // namespace astrai::backend::sampling
