// Attention kernel rate: causal prefill of one sequence through a paged K/V cache, as the
// engine runs it (pages of 16 in huge pages, shuffled; f32 or bf16 K/V), and batched decode over
// cached contexts, on the 100M model's head shapes (12 query heads over 4 kv heads of 64 dims
// unless told otherwise). Reports GFLOP/s (4 * key-query pairs * heads * dim) next to the BLAS
// SGEMM rate measured in the same run, and for decode the K/V bytes read per second next to the
// machine's rate for reads in shuffled pieces of a page, for the level in use (ASTRAI_CPU_ISA
// chooses it). --train times the trainer's kernels on one document instead: the forward (with
// the row log-sum-exp) and the backward (dq, dk, dv).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

#include "base/huge_buffer.h"
#include "bench_probes.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_backward.h"

namespace {

using namespace astrai;

constexpr const char* kUsage =
    "usage: attention_bench [--tokens 512,4096] [--heads 12] [--kv-heads 4] [--dim 64]\n"
    "                       [--kv-dtype f32|bf16] [--decode-batch 32] [--ctx 576] [--threads N]\n"
    "                       [--page-size 16] [--prefix 0] [--train 256,1024]\n"
    "                       [--quick] [--cpu-time]\n"
    "  --tokens        prefill lengths, comma-separated (default 512,4096)\n"
    "  --prefix        prefill: positions already cached before the prompt (a prefix-cache\n"
    "                  hit, a chat's earlier turns; default 0)\n"
    "  --decode-batch  sequences of the decode run (default 32; 0 skips it)\n"
    "  --ctx           decode: cached positions per sequence (default 576)\n"
    "  --page-size     K/V slots per page (default 16, the engine's)\n"
    "  --threads N     OpenMP threads (default 2)\n"
    "  --train         training instead: forward and backward of one document of each length\n"
    "                  (comma-separated), f32 q/k/v as the trainer keeps them\n";

struct AttnShape {
  int64_t heads = 12, kv_heads = 4, dim = 64;
  bool bf16 = false;
};

int kPage = 16;  // --page-size

// A paged cache holding `seqs` sequences of `len` positions each, pages shuffled (as after a
// server has run a while, a sequence's pages are scattered over the pool).
struct PagedKv {
  HugeBuffer k, v;  // as the engine's cache: 2 MiB huge pages (base/huge_buffer.h)
  std::vector<std::vector<int32_t>> tables;
  kernels::KvSource source;

  PagedKv(const AttnShape& s, int64_t seqs, int64_t len) {
    const int64_t pages_per = (len + kPage - 1) / kPage, pages = seqs * pages_per;
    const size_t n = static_cast<size_t>(pages * s.kv_heads * kPage * s.dim);
    const bench::Floats k32 = bench::random_floats(n, 11), v32 = bench::random_floats(n, 12);
    std::vector<int32_t> order(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    for (int64_t q = 0; q < seqs; ++q)
      tables.emplace_back(order.begin() + q * pages_per, order.begin() + (q + 1) * pages_per);
    k = HugeBuffer(s.bf16 ? (n + 1) / 2 : n), v = HugeBuffer(s.bf16 ? (n + 1) / 2 : n);
    if (s.bf16) {
      uint16_t* k16 = reinterpret_cast<uint16_t*>(k.data());
      uint16_t* v16 = reinterpret_cast<uint16_t*>(v.data());
      for (size_t i = 0; i < n; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &k32[i], 4), std::memcpy(&b, &v32[i], 4);
        k16[i] = static_cast<uint16_t>(a >> 16), v16[i] = static_cast<uint16_t>(b >> 16);
      }
    } else {
      std::copy(k32.begin(), k32.end(), k.data());
      std::copy(v32.begin(), v32.end(), v.data());
    }
    source = kernels::KvSource{k.data(), v.data(), kPage, s.bf16};
  }
};

double rate(double flops, double seconds) { return flops / seconds / 1e9; }

void prefill(const AttnShape& s, int64_t tokens, int64_t prefix, double t_min, double blas) {
  PagedKv kv(s, 1, prefix + tokens);
  const kernels::AttentionDims d{s.heads, s.kv_heads, s.dim, s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim))};
  bench::Floats q = bench::random_floats(static_cast<size_t>(tokens * s.heads * s.dim), 13);
  bench::Floats out(q.size());
  const kernels::AttentionSeq seq{0, static_cast<int32_t>(tokens), static_cast<int32_t>(prefix), kv.tables[0].data()};
  kernels::AttentionScratch scratch;
  const double sec = bench::best_seconds(
      [&] { kernels::attention(q.data(), kv.source, &seq, 1, d, out.data(), scratch, nullptr); }, t_min);
  const double pairs = static_cast<double>(tokens) * (static_cast<double>(prefix) + 0.5 * static_cast<double>(tokens + 1));
  const double flops = 4.0 * pairs * static_cast<double>(s.heads * s.dim);
  const std::string after = prefix > 0 ? " after " + std::to_string(prefix) + " cached" : "";
  std::printf("prefill %5lld tokens%s: %8.3f ms per layer  %6.1f GFLOP/s  (%3.0f%% of SGEMM)\n",
              static_cast<long long>(tokens), after.c_str(), sec * 1e3, rate(flops, sec), 100 * rate(flops, sec) / blas);
}

void decode(const AttnShape& s, int64_t batch, int64_t ctx, double t_min, double blas) {
  PagedKv kv(s, batch, ctx + 1);
  const kernels::AttentionDims d{s.heads, s.kv_heads, s.dim, s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim))};
  bench::Floats q = bench::random_floats(static_cast<size_t>(batch * s.heads * s.dim), 14);
  bench::Floats out(q.size());
  std::vector<kernels::AttentionSeq> seqs;
  for (int64_t b = 0; b < batch; ++b)
    seqs.push_back({static_cast<int32_t>(b), 1, static_cast<int32_t>(ctx), kv.tables[static_cast<size_t>(b)].data()});
  kernels::AttentionScratch scratch;
  const double sec = bench::best_seconds(
      [&] { kernels::attention(q.data(), kv.source, seqs.data(), batch, d, out.data(), scratch, nullptr); }, t_min);
  const double flops = 4.0 * static_cast<double>(batch * (ctx + 1) * s.heads * s.dim);
  const double bytes = static_cast<double>(2 * batch * (ctx + 1) * s.kv_heads * s.dim) * (s.bf16 ? 2 : 4);
  std::printf("decode %lld x %lld ctx: %8.3f ms per layer  %6.1f GFLOP/s  (%3.0f%% of SGEMM)  %5.1f GB/s of K/V\n",
              static_cast<long long>(batch), static_cast<long long>(ctx), sec * 1e3, rate(flops, sec),
              100 * rate(flops, sec) / blas, bytes / sec / 1e9);
}

// The trainer's attention over one document of `len` tokens: forward (out and the row
// log-sum-exp) and backward, each timed on its own; GFLOP/s counts the forward's QK^T and PV
// (4 * pairs * heads * dim) and the backward's five products per pair (10 * pairs * heads * dim).
void train(const AttnShape& s, int64_t len, double t_min) {
  const kernels::AttnShape d{s.heads, s.kv_heads, s.dim, s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim))};
  const std::vector<kernels::AttnSpan> spans = {{0, static_cast<int32_t>(len)}};
  const auto q = bench::random_floats(static_cast<size_t>(len * s.heads * s.dim), 21);
  const auto k = bench::random_floats(static_cast<size_t>(len * s.kv_heads * s.dim), 22);
  const auto v = bench::random_floats(static_cast<size_t>(len * s.kv_heads * s.dim), 23);
  const auto dout = bench::random_floats(q.size(), 24);
  bench::Floats out(q.size()), lse(static_cast<size_t>(len * s.heads)), dq(q.size()), dk(k.size()), dv(v.size());
  const double fwd = bench::best_seconds(
      [&] { kernels::attention_forward_train(q.data(), k.data(), v.data(), spans, d, out.data(), lse.data()); }, t_min);
  const double bwd = bench::best_seconds([&] {
    kernels::attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), spans, d, dq.data(),
                                dk.data(), dv.data());
  }, t_min);
  const double pairs = 0.5 * static_cast<double>(len) * static_cast<double>(len + 1) * static_cast<double>(s.heads * s.dim);
  std::printf("train %5lld tokens: forward %8.3f ms (%6.1f GFLOP/s), backward %8.3f ms (%6.1f GFLOP/s) per layer\n",
              static_cast<long long>(len), fwd * 1e3, rate(4 * pairs, fwd), bwd * 1e3, rate(10 * pairs, bwd));
}

std::vector<int64_t> parse_list(const std::string& a) {
  std::vector<int64_t> v;
  size_t i = 0;
  while (i < a.size()) {
    const size_t j = a.find(',', i);
    v.push_back(std::atoll(a.substr(i, j - i).c_str()));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  astrai::kernels::reexec_for_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  AttnShape s;
  std::vector<int64_t> tokens = {512, 4096}, train_lens;
  int64_t batch = 32, ctx = 576, prefix = 0;
  int threads = 2;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--tokens" && has) {
      tokens = parse_list(argv[++i]);
    } else if (a == "--heads" && has) {
      s.heads = std::atoll(argv[++i]);
    } else if (a == "--kv-heads" && has) {
      s.kv_heads = std::atoll(argv[++i]);
    } else if (a == "--dim" && has) {
      s.dim = std::atoll(argv[++i]);
    } else if (a == "--kv-dtype" && has && (std::string(argv[i + 1]) == "f32" || std::string(argv[i + 1]) == "bf16")) {
      s.bf16 = std::string(argv[++i]) == "bf16";
    } else if (a == "--decode-batch" && has) {
      batch = std::atoll(argv[++i]);
    } else if (a == "--page-size" && has) {
      kPage = std::atoi(argv[++i]);
    } else if (a == "--prefix" && has) {
      prefix = std::atoll(argv[++i]);
    } else if (a == "--ctx" && has) {
      ctx = std::atoll(argv[++i]);
    } else if (a == "--threads" && has) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--train" && has) {
      train_lens = parse_list(argv[++i]);
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--cpu-time") {
      astrai::bench::clock_mode() = astrai::bench::Clock::kCpu;
    } else {
      return astrai::bench::usage_error(kUsage, a);
    }
  }
  if (s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || s.dim <= 0 || threads <= 0 || ctx < 0 ||
      batch < 0 || prefix < 0) {
    std::fprintf(stderr, "attention_bench: heads must be a positive multiple of kv heads; dims, threads positive\n");
    return 2;
  }
  set_num_threads(threads);
  const double t_min = quick ? 0.1 : 0.3;
  std::printf("cpu: %s; %d threads; %lld heads over %lld kv heads of %lld dims; K/V %s, pages of %d\n",
              astrai::bench::cpu_and_level().c_str(), threads, static_cast<long long>(s.heads),
              static_cast<long long>(s.kv_heads), static_cast<long long>(s.dim), s.bf16 ? "bf16" : "f32", kPage);
  const double blas = astrai::bench::sgemm_gflops(512, 768, 768, t_min);
  std::printf("BLAS SGEMM 512 x 768 x 768: %.1f GFLOP/s\n", blas);
  if (!train_lens.empty()) {
    for (int64_t t : train_lens) {
      if (t > 0) train(s, t, t_min);
    }
    return 0;
  }
  for (int64_t t : tokens) {
    if (t > 0) prefill(s, t, prefix, t_min, blas);
  }
  if (batch > 0) {
    // Decode reads each (sequence, kv head)'s K and V pages from scattered places: the machine's
    // rate for that pattern, next to the kernel's.
    const size_t page = static_cast<size_t>(kPage * s.dim) * (s.bf16 ? 2 : 4);
    std::printf("scattered reads (sum over 512 MB in shuffled pieces): %zu B %.1f GB/s, %zu B %.1f GB/s, 1 MiB %.1f GB/s\n",
                page, astrai::bench::scattered_read_gbs(page), 4 * page, astrai::bench::scattered_read_gbs(4 * page),
                astrai::bench::scattered_read_gbs(size_t{1} << 20));
    decode(s, batch, ctx, t_min, blas);
  }
  return 0;
}
