// Shared measurement helpers for the kernel and forward benchmarks: timing, a copy-bandwidth
// probe and the BLAS SGEMM rate, so every benchmark reports its numbers next to the machine's
// ceilings measured in the same process.
#pragma once

#include "base/huge_buffer.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "base/parallel.h"
#include "base/timer.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/dispatch.h"

namespace astrai::bench {

// How a measurement is timed. kWall: wall clock. kCpu: process CPU seconds divided by the
// thread count, for a machine shared with other jobs: time slices lost to them do not count,
// and with OMP_WAIT_POLICY=passive idle threads sleep instead of spinning, so this estimates
// the wall time on a quiet machine (it hides load imbalance between the threads).
enum class Clock { kWall, kCpu };
inline Clock& clock_mode() {
  static Clock mode = Clock::kWall;
  return mode;
}

inline double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

class Stopwatch {
 public:
  Stopwatch() : cpu_(process_cpu_seconds()) {}
  double seconds() const {
    if (clock_mode() == Clock::kWall) return wall_.seconds();
    return (process_cpu_seconds() - cpu_) / num_threads();
  }

 private:
  Timer wall_;
  double cpu_;
};

// Best time of fn() over repetitions lasting at least min_seconds in total (after one
// warm-up call) and at least min_reps calls.
template <typename Fn>
double best_seconds(Fn&& fn, double min_seconds = 0.3, int min_reps = 3) {
  fn();
  double best = 1e30, total = 0;
  for (int rep = 0; rep < min_reps || total < min_seconds; ++rep) {
    Stopwatch t;
    fn();
    const double s = t.seconds();
    best = std::min(best, s);
    total += s;
    if (rep > 1000) break;
  }
  return best;
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], AlignedFree>;

template <typename T>
Buffer<T> alloc(size_t count) {
  const size_t bytes = (count * sizeof(T) + 4095) / 4096 * 4096;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(4096, bytes)));
}

// An allocator of 64-byte-aligned storage. The model's activations are on cache lines
// (backend buffers, tensors); a std::vector's large buffer starts 16 bytes past a page, which
// splits every other 32-byte load across two lines and made the linear kernel measure 10-15%
// slower in the first of two identical gemm_bench runs (2026-12-07).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(64, (std::max<size_t>(n * sizeof(T), 1) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};
using Floats = std::vector<float, CacheLineAllocator<float>>;

inline Floats random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  Floats v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

struct CopyBandwidth {
  double copy_gbs;  // STREAM convention: bytes read + bytes written per second
  double read_gbs;  // bytes read per second by a pure streaming sum
};

// Copies `bytes` (split evenly over the current OpenMP threads) and streams the same bytes
// through a vector sum. Pages are touched first by the thread that will use them; the buffers
// are HugeBuffers, as the model weights and the KV pool are.
inline CopyBandwidth copy_bandwidth(size_t bytes = size_t{1} << 30) {
  const size_t n = bytes / 2 / sizeof(float);
  HugeBuffer src(n), dst(n);  // huge pages, like the weights and the KV cache
  const int nt = omp_get_max_threads();
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const size_t b = n * t / nt, e = n * (t + 1) / nt;
    for (size_t i = b; i < e; ++i) src.data()[i] = static_cast<float>(i & 1023);
    std::memset(dst.data() + b, 0, (e - b) * sizeof(float));
  }
  const double copy_s = best_seconds(
      [&] {
#pragma omp parallel num_threads(nt)
        {
          const int t = omp_get_thread_num();
          const size_t b = n * t / nt, e = n * (t + 1) / nt;
          std::memcpy(dst.data() + b, src.data() + b, (e - b) * sizeof(float));
        }
      },
      0.5, 3);
  volatile float sink = 0;
  const double read_s = best_seconds(
      [&] {
        float total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
        {
          const int t = omp_get_thread_num();
          const size_t b = n * t / nt, e = n * (t + 1) / nt;
          // 64 independent lanes: vectorised at any instruction-set level, one pass over memory.
          float lanes[64] = {};
          for (size_t i = b; i + 64 <= e; i += 64)
            for (int l = 0; l < 64; ++l) lanes[l] += src.data()[i + l];
          for (float v : lanes) total += v;
        }
        sink = total;
      },
      0.5, 3);
  (void)sink;
  const double half = static_cast<double>(n * sizeof(float));
  return {2 * half / copy_s / 1e9, half / read_s / 1e9};
}

// GB/s of a vector sum over `bytes` (huge pages) read in pieces of `piece` bytes taken in a
// shuffled order, split evenly over the current OpenMP threads: the access pattern of decode
// attention over a paged KV cache (a page of one kv head is a piece), without its arithmetic.
inline double scattered_read_gbs(size_t piece, size_t bytes = size_t{512} << 20) {
  const size_t pieces = bytes / piece, floats = piece / sizeof(float);
  HugeBuffer buf(pieces * floats);
  for (size_t i = 0; i < buf.size(); ++i) buf.data()[i] = static_cast<float>(i & 1023);
  std::vector<size_t> order(pieces);
  for (size_t i = 0; i < pieces; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(1));
  volatile float sink = 0;
  const double s = best_seconds(
      [&] {
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
          float lanes[64] = {};  // independent lanes across pieces: vectorised, no chain per piece
#pragma omp for schedule(static)
          for (size_t i = 0; i < pieces; ++i) {
            const float* p = buf.data() + order[i] * floats;
            for (size_t e = 0; e + 64 <= floats; e += 64)
              for (int l = 0; l < 64; ++l) lanes[l] += p[e + l];
          }
          for (float v : lanes) total += v;
        }
        sink = total;
      },
      0.5, 3);
  (void)sink;
  return static_cast<double>(pieces * piece) / s / 1e9;
}

// The first three fields of /proc/loadavg: the machine is shared, so every table says how
// busy it was while measured.
// For a bad command line: says what was not understood, prints the usage, returns exit code 2.
inline int usage_error(const char* usage, const std::string& what) {
  std::fprintf(stderr, "unknown or incomplete option: %s\n%s", what.c_str(), usage);
  return 2;
}

// "AMD EPYC ..., kernels v4": every table names the CPU and the level it was measured with.
inline std::string cpu_and_level() {
  const kernels::CpuInfo& cpu = kernels::cpu_info();
  return (cpu.model.empty() ? cpu.arch : cpu.model) + ", kernels " + std::string(kernels::isa_name(kernels::active_isa())) +
         ", OpenBLAS " + kernels::blas_core();
}

inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// GFLOP/s of OpenBLAS y[M, N] = x[M, K] · W[N, K]^T with the current thread count.
inline double sgemm_gflops(int64_t m, int64_t n, int64_t k, double min_seconds = 0.3) {
  const auto x = random_floats(static_cast<size_t>(m * k), 1), w = random_floats(static_cast<size_t>(n * k), 2);
  Floats y(static_cast<size_t>(m * n));
  const double s = best_seconds(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f,
                    y.data(), static_cast<int>(n));
      },
      min_seconds);
  return 2.0 * m * n * k / s / 1e9;
}

// BLIS loaded at run time (Debian libblis4-openmp, if installed) so the same shapes can be
// measured against it in one process without linking two BLAS libraries into the project.
class Blis {
 public:
  Blis() {
    for (const char* name : {"/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "libblis.so.4"}) {
      handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle_) break;
    }
    if (!handle_) return;
    sgemm_ = reinterpret_cast<SgemmFn>(dlsym(handle_, "cblas_sgemm"));
    set_threads_ = reinterpret_cast<SetThreadsFn>(dlsym(handle_, "bli_thread_set_num_threads"));
    if (!sgemm_ || !set_threads_) sgemm_ = nullptr;
  }
  Blis(const Blis&) = delete;
  Blis& operator=(const Blis&) = delete;
  ~Blis() {
    if (handle_) dlclose(handle_);
  }
  bool available() const { return sgemm_ != nullptr; }

  // GFLOP/s of y = x · W^T through BLIS with `threads` threads.
  double sgemm_gflops(int64_t m, int64_t n, int64_t k, int threads, double min_seconds = 0.3) const {
    set_threads_(threads);
    const auto x = random_floats(static_cast<size_t>(m * k), 1), w = random_floats(static_cast<size_t>(n * k), 2);
    Floats y(static_cast<size_t>(m * n));
    const double s = best_seconds(
        [&] {
          sgemm_(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                 1.0f, x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f, y.data(), static_cast<int>(n));
        },
        min_seconds);
    return 2.0 * m * n * k / s / 1e9;
  }

 private:
  using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float, const float*, int,
                           const float*, int, float, float*, int);
  using SetThreadsFn = void (*)(int64_t);
  void* handle_ = nullptr;
  SgemmFn sgemm_ = nullptr;
  SetThreadsFn set_threads_ = nullptr;
};

}  // namespace astrai::bench
