// Linear-kernel benchmark (reports numbers, never passes or fails):
//   1. copy bandwidth (the decode ceiling) and the arithmetic peak (kernels/cpu/peak.h: f32 FMA
//      and the 8-bit dot product, register-only loops), 1 and 2 threads;
//   2. OpenBLAS SGEMM vs kernels::linear (f32 and bf16 weights) on transformer shapes,
//      1 and 2 threads, GFLOP/s;
//   3. quantized weights times 8-bit activations on prefill and batched-decode shapes (M = 512,
//      8, 32), GOP/s, with and without VNNI where the CPU has it;
//   4. decode-shaped GEMV (M = 1 and 8): weight bytes read per second vs the copy probe.
// Usage: see kUsage below (gemm_bench --help).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_probes.h"
#include "kernels/cpu/gemm_mode.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/peak.h"
#include "tensor/dtype.h"

using namespace astrai;

namespace {

std::vector<uint16_t> to_half(const bench::Floats& v, DType t) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return h;
}

double linear_seconds(int64_t m, int64_t n, int64_t k, DType dtype, double min_seconds) {
  const auto x = bench::random_floats(static_cast<size_t>(m * k), 3);
  const auto wf = bench::random_floats(static_cast<size_t>(n * k), 4, 0.05f);
  std::vector<uint16_t> wh;
  std::vector<uint8_t> wq;
  const void* data = wf.data();
  if (is_block_type(dtype)) {
    wq.resize(dtype_bytes(dtype, n * k));
    convert_from_f32(wf.data(), dtype, wq.data(), wf.size());
    data = wq.data();
  } else if (dtype != DType::kF32) {
    wh = to_half(wf, dtype);
    data = wh.data();
  }
  // On a page, as a checkpoint's mapped weights start on a cache line (a std::vector's large
  // buffer starts 16 bytes past a page, so every 64-byte load of a row would span two lines).
  const size_t bytes = dtype_bytes(dtype, n * k);
  bench::Buffer<uint8_t> aligned = bench::alloc<uint8_t>(bytes);
  std::memcpy(aligned.get(), data, bytes);
  bench::Floats y(static_cast<size_t>(m * n));
  const kernels::WeightView view{aligned.get(), dtype, n, k};
  return bench::best_seconds([&] { kernels::linear(x.data(), m, view, nullptr, y.data()); }, min_seconds);
}

}  // namespace

constexpr const char* kUsage =
    "usage: gemm_bench [--quick] [--m M] [--shape M,N,K] [--gemv-only] [--gemv-shape N,K] [--quant-only] [--cpu-time]\n"
    "  --quick     shorter timing runs\n"
    "  --gemv-only only the copy probe and the decode GEMV table\n"
    "  --gemv-shape N,K  the decode GEMV table's weight shape (default 24576,2048)\n"
    "  --quant-only only the copy probe and the quantized prefill GEMM table\n"
    "  --m M       the GEMM table at M rows (decode batches) on the 100M model's shapes\n"
    "  --shape M,N,K  only the float GEMM table, on this shape (repeatable)\n"
    "  --cpu-time  time by process CPU time / threads, for a busy machine (run with\n"
    "              OMP_WAIT_POLICY=passive; see bench/bench_probes.h)\n";

int main(int argc, char** argv) {
  astrai::kernels::reexec_for_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  bool quick = false, gemv_only = false, quant_only = false;
  int64_t batch_m = 0;  // --m M: the GEMM table at M rows (decode batches) on the 100M model's shapes
  int64_t gemv_n = 24576, gemv_k = 2048;
  struct Shape { int64_t m, n, k; };
  std::vector<Shape> only_shapes;  // --shape M,N,K
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--m" && i + 1 < argc) {
      batch_m = std::atoll(argv[++i]);
    } else if (a == "--gemv-shape" && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%ld,%ld", &gemv_n, &gemv_k) == 2 && gemv_n > 0 && gemv_k > 0) {
      ++i;
    } else if (Shape sh{}; a == "--shape" && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%ld,%ld,%ld", &sh.m, &sh.n, &sh.k) == 3 && sh.m > 0 && sh.n > 0 && sh.k > 0) {
      only_shapes.push_back(sh);
      ++i;
    } else if (a == "--gemv-only") {
      gemv_only = true;
    } else if (a == "--quant-only") {
      quant_only = true;
    } else if (a == "--cpu-time") {
      bench::clock_mode() = bench::Clock::kCpu;
    } else {
      return bench::usage_error(kUsage, a);
    }
  }
  const double t_min = quick ? 0.1 : 0.3;

  std::printf("cpu: %s\n", bench::cpu_and_level().c_str());
  std::printf("load average at the start: %s; clock: %s\n", bench::load_average().c_str(),
              bench::clock_mode() == bench::Clock::kCpu ? "process CPU time / threads (--cpu-time)" : "wall");
  std::printf("== copy bandwidth (1 GiB memcpy, STREAM counting read+write; streaming read) ==\n");
  bench::CopyBandwidth bw[3];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    bw[threads] = bench::copy_bandwidth();
    std::printf("threads=%d  copy %.1f GB/s  read %.1f GB/s\n", threads, bw[threads].copy_gbs, bw[threads].read_gbs);
  }
  std::printf("== arithmetic peak (register-only loops of one instruction; the int8 one with VNNI where used) ==\n");
  kernels::PeakRates peak[3];
  for (int threads : {1, 2}) {
    peak[threads] = kernels::peak_rates(threads);
    std::printf("%s\n", kernels::peak_summary(peak[threads]).c_str());
  }

  const bench::Blis blis;
  std::printf("\n== GEMM y = x W^T: GFLOP/s (OpenBLAS sgemm | BLIS sgemm | linear f32 | linear bf16) ==\n");
  if (astrai::kernels::bf16_dot())
    std::printf("(bf16: the bf16-dot mode, %s: bf16-rounded activations; ASTRAI_BF16_DOT=0 for exact widening)\n",
                astrai::kernels::bf16_dot_name());
  if (!blis.available()) std::printf("(BLIS not installed: apt-get install libblis-openmp-dev to compare)\n");
  std::vector<Shape> shapes = {{512, 768, 768},   {512, 2048, 768}, {512, 768, 2048},
                               {512, 2304, 768},  {4096, 768, 768}, {4096, 2048, 768},
                               {4096, 768, 2048}, {512, 32000, 768}};
  if (quick) shapes = {{512, 768, 768}, {512, 2048, 768}, {512, 768, 2048}};
  if (batch_m > 0)  // q/k/v, o, gate+up, down and the LM head of the bench decode model
    shapes = {{batch_m, 1280, 768}, {batch_m, 768, 768}, {batch_m, 4096, 768}, {batch_m, 768, 2048},
              {batch_m, 32000, 768}};
  if (!only_shapes.empty()) shapes = only_shapes;
  std::printf("%5s %6s %6s %3s | %8s %8s %8s %8s | %6s %6s\n", "M", "N", "K", "thr", "openblas", "blis", "f32", "bf16",
              "f32/openblas", "f32/peak");
  if (gemv_only || quant_only) shapes.clear();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto& s : shapes) {
      const double flop = 2.0 * s.m * s.n * s.k;
      const double blas = bench::sgemm_gflops(s.m, s.n, s.k, t_min);
      const double blis_gf = blis.available() ? blis.sgemm_gflops(s.m, s.n, s.k, threads, t_min) : 0.0;
      const double f32 = flop / linear_seconds(s.m, s.n, s.k, DType::kF32, t_min) / 1e9;
      const double bf16 = flop / linear_seconds(s.m, s.n, s.k, DType::kBF16, t_min) / 1e9;
      std::printf("%5ld %6ld %6ld %3d | %8.1f %8.1f %8.1f %8.1f | %11.0f%% %7.0f%%\n", static_cast<long>(s.m),
                  static_cast<long>(s.n), static_cast<long>(s.k), threads, blas, blis_gf, f32, bf16, 100 * f32 / blas,
                  100 * f32 / (peak[threads].f32_flops / 1e9));
    }
  }

  if (!only_shapes.empty()) return 0;  // --shape: the float GEMM table only
  if (!gemv_only) {
    // The 100M model's gate/up and down projections at 512 rows (prefill), gate/up at 8 and 32
    // (decode batches), q8 activations.
    const bool saved_vnni = kernels::vnni_allowed();
    kernels::set_vnni(true);
    const std::string vnni = kernels::vnni_in_use();
    std::printf("\n== quantized GEMM, q8 activations: GOP/s (2 M N K / s), with VNNI (%s) | without; the best "
                "of the two as a share of the int8 peak ==\n",
                vnni.empty() ? "not on this CPU" : vnni.c_str());
    std::printf("%5s %6s %6s %5s %3s | %8s %8s | %6s %6s\n", "M", "N", "K", "dtype", "thr", "vnni", "no vnni", "ratio",
                "/peak");
    const kernels::Activations saved = kernels::activations();
    kernels::set_activations(kernels::Activations::kQ8);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
        for (const Shape s : {Shape{8, 2048, 768}, Shape{32, 2048, 768}, Shape{512, 2048, 768}, Shape{512, 768, 2048}}) {
          const double op = 2.0 * s.m * s.n * s.k / 1e9;
          kernels::set_vnni(true);
          const double with = vnni.empty() ? 0.0 : op / linear_seconds(s.m, s.n, s.k, dt, t_min);
          kernels::set_vnni(false);
          const double without = op / linear_seconds(s.m, s.n, s.k, dt, t_min);
          const double int8_peak = peak[threads].int8_ops / 1e9;
          std::printf("%5ld %6ld %6ld %5s %3d | %8.1f %8.1f | %5.2fx %5.0f%%\n", static_cast<long>(s.m),
                      static_cast<long>(s.n), static_cast<long>(s.k), std::string(dtype_name(dt)).c_str(), threads,
                      with, without, with / without, int8_peak > 0 ? 100 * std::max(with, without) / int8_peak : 0.0);
        }
      }
    }
    kernels::set_vnni(saved_vnni);
    kernels::set_activations(saved);
  }
  if (quant_only) return 0;

  std::printf("\n== decode GEMV: weight GB/s read (vs 2-thread copy %.1f GB/s, read %.1f GB/s); quantized weights "
              "times %s activations (ASTRAI_ACTIVATIONS) ==\n",
              bw[2].copy_gbs, bw[2].read_gbs, kernels::activations_name(kernels::activations()));
  std::printf("%3s %6s %6s %5s %3s | %8s %8s %9s\n", "M", "N", "K", "dtype", "thr", "GB/s", "%copy", "Gweight/s");
  // One 24576 x 2048 matrix by default: f32 201 MB, bf16 101 MB, Q8_0 53 MB, Q6_K 41 MB, Q5_K
  // 35 MB, Q4_0 and Q4_K 28 MB (the last near the size of a large L3: --gemv-shape for others).
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K,
                     DType::kQ6_K}) {
      for (int64_t m : {1, 2, 3, 4, 8}) {
        const int64_t n = gemv_n, k = gemv_k;
        if (is_block_type(dt) && k % block_elems(dt) != 0) continue;
        const double s = linear_seconds(m, n, k, dt, t_min);
        const double gbs = static_cast<double>(dtype_bytes(dt, n * k)) / s / 1e9;
        std::printf("%3ld %6ld %6ld %5s %3d | %8.1f %7.0f%% %9.2f\n", static_cast<long>(m), static_cast<long>(n),
                    static_cast<long>(k), std::string(dtype_name(dt)).c_str(), threads, gbs,
                    100 * gbs / bw[2].copy_gbs, static_cast<double>(n * k) / s / 1e9);
      }
    }
    if (threads == 2) {
      // BLAS for M = 1 (its GEMV path) on the same f32 weights.
      const int64_t n = 24576, k = 2048;
      const auto x = bench::random_floats(static_cast<size_t>(k), 5);
      const auto w = bench::random_floats(static_cast<size_t>(n * k), 6);
      bench::Floats y(static_cast<size_t>(n));
      const double s = bench::best_seconds([&] {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w.data(),
                    static_cast<int>(k), x.data(), 1, 0.0f, y.data(), 1);
      }, t_min);
      std::printf("blas sgemv M=1 f32 2 threads: %.1f GB/s\n", static_cast<double>(n * k * 4) / s / 1e9);
    }
  }
  std::printf("\nload average at the end: %s\n", bench::load_average().c_str());
  return 0;
}
