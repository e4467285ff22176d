#include "train/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/timer.h"

#if ASTRAI_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (no deprecated C++ bindings to link)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace astrai::train {

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

}  // namespace

int launched_world_size() {
  // Open MPI's mpirun, MPICH/Hydra and Slurm's srun (PMI), srun without an MPI plugin.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const int n = env_int(name);
    if (n > 0) return n;
  }
  return 1;
}

#if ASTRAI_HAVE_MPI

namespace {

// Elements per collective call: bounds the int count MPI takes and rank 0's gather buffer.
constexpr size_t kChunk = size_t{1} << 22;

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommunicatorOptions& o) : options_(o) {
    int provided = 0;
    // The trainer's OpenMP threads never call MPI: only the main thread does.
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    ASTRAI_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error_string(rc));
    // Errors come back as codes (and become astrai::Error) instead of aborting silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
  }
  ~MpiCommunicator() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  void all_reduce_sum(float* data, size_t n) override { reduce(data, n); }
  void all_reduce_sum(double* data, size_t n) override { reduce(data, n); }

  void abort_all(const std::string& what) override {
    std::fprintf(stderr, "error: rank %d of %d: %s\n", rank_, size_, what.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  template <typename T>
  void reduce(T* data, size_t n) {
    Timer timer;
    for (size_t off = 0; off < n; off += kChunk) {
      const int count = static_cast<int>(std::min(kChunk, n - off));
      if (options_.deterministic) reduce_in_rank_order(data + off, count);
      else reduce_by_library(data + off, count);
    }
    seconds_ += timer.seconds();
    bytes_ += static_cast<int64_t>(n * sizeof(T));
  }

  template <typename T>
  void reduce_by_library(T* data, int count) {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, count, mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD, &req), "MPI_Iallreduce");
    wait(&req, "all-reduce", count * sizeof(T));
  }

  // Gather to rank 0 in rank order, sum there in rank order, broadcast the sum.
  template <typename T>
  void reduce_in_rank_order(T* data, int count) {
    std::vector<T>& gathered = gather_buffer<T>();
    if (rank_ == 0) gathered.resize(static_cast<size_t>(count) * static_cast<size_t>(size_));
    MPI_Request req;
    check(MPI_Igather(data, count, mpi_type<T>(), gathered.data(), count, mpi_type<T>(), 0, MPI_COMM_WORLD, &req),
          "MPI_Igather");
    wait(&req, "deterministic all-reduce (gather)", count * sizeof(T));
    if (rank_ == 0) sum_in_rank_order(gathered.data(), size_, static_cast<size_t>(count), data);
    check(MPI_Ibcast(data, count, mpi_type<T>(), 0, MPI_COMM_WORLD, &req), "MPI_Ibcast");
    wait(&req, "deterministic all-reduce (broadcast)", count * sizeof(T));
  }

  template <typename T>
  std::vector<T>& gather_buffer() {
    if constexpr (sizeof(T) == sizeof(float)) return gather_f32_;
    else return gather_f64_;
  }

  void check(int rc, const char* what) const {
    ASTRAI_CHECK(rc == MPI_SUCCESS, what, " failed on rank ", rank_, ": ", mpi_error_string(rc));
  }

  // Polls `req` until it completes; past the deadline every rank still waiting gives up (the
  // trainer then aborts the job: a collective cannot be cancelled). A non-blocking collective
  // progresses only inside MPI calls (a large all-reduce needs thousands of them), so the first
  // second of a wait polls back to back, yielding the core to oversubscribed ranks; a longer
  // wait (for a rank writing a checkpoint, or a slower one) sleeps 200 µs between polls.
  void wait(MPI_Request* req, const char* what, size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (options_.timeout_s > 0 && waited > options_.timeout_s) {
        fail(what, " of ", bytes, " bytes did not complete within --collective-timeout ", options_.timeout_s,
             " s on rank ", rank_, " of ", size_, ": another rank died, stalled or is not at the same step");
      }
      if (waited < 1.0) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  CommunicatorOptions options_;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::vector<float> gather_f32_;
  std::vector<double> gather_f64_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options) {
  if (launched_world_size() <= 1) return std::make_unique<LocalCommunicator>();
  return std::make_unique<MpiCommunicator>(options);
}

#else  // !ASTRAI_HAVE_MPI

std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions&) {
  const int n = launched_world_size();
  ASTRAI_CHECK(n <= 1, "launched as one of ", n, " processes (mpirun/srun), but this astrai was built without MPI: ",
               "install MPI (Debian: libopenmpi-dev openmpi-bin) and rebuild for data-parallel training");
  return std::make_unique<LocalCommunicator>();
}

#endif

}  // namespace astrai::train
