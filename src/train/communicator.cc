#include "train/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
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

void LocalCommunicator::gather_to_root(const float* mine, float* out, const std::vector<size_t>& bounds) {
  ASTRAI_CHECK(bounds.size() == 2, "gather_to_root: ", bounds.size(), " bounds for 1 rank");
  if (bounds[1] > bounds[0]) std::memcpy(out + bounds[0], mine, (bounds[1] - bounds[0]) * sizeof(float));
}

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
    // The two stages of the overlapped deterministic sum: their own communicators, so that the
    // gathers (started in bucket order) and the broadcasts (started in bucket order as the
    // gathers complete) are each in the same order on every rank.
    MPI_Comm_dup(MPI_COMM_WORLD, &gather_comm_);
    MPI_Comm_dup(MPI_COMM_WORLD, &bcast_comm_);
    MPI_Comm_set_errhandler(gather_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(bcast_comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    MPI_Comm_free(&gather_comm_);
    MPI_Comm_free(&bcast_comm_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  void all_reduce_sum(float* data, size_t n) override {
    ASTRAI_CHECK(pending_.empty(), "all_reduce_sum while overlapped sums are pending");
    reduce(data, n);
  }
  void all_reduce_sum(double* data, size_t n) override {
    ASTRAI_CHECK(pending_.empty(), "all_reduce_sum while overlapped sums are pending");
    reduce(data, n);
  }

  void start_all_reduce_sum(float* data, size_t n) override {
    Timer timer;
    for (size_t off = 0; off < n; off += kChunk) {
      auto op = std::make_unique<Pending>();
      op->data = data + off;
      op->count = static_cast<int>(std::min(kChunk, n - off));
      if (options_.deterministic) {
        op->stage = Stage::kGather;
        if (rank_ == 0) op->gathered.resize(static_cast<size_t>(op->count) * static_cast<size_t>(size_));
        check(MPI_Igather(op->data, op->count, MPI_FLOAT, op->gathered.data(), op->count, MPI_FLOAT, 0, gather_comm_,
                          &op->req),
              "MPI_Igather");
      } else {
        check(MPI_Iallreduce(MPI_IN_PLACE, op->data, op->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &op->req),
              "MPI_Iallreduce");
      }
      pending_.push_back(std::move(op));
    }
    bytes_ += static_cast<int64_t>(n * sizeof(float));
    seconds_ += timer.seconds();
  }

  void progress() override {
    if (pending_.empty()) return;
    Timer timer;
    advance();
    seconds_ += timer.seconds();
  }

  void finish_all_reduces() override {
    if (pending_.empty()) return;
    Timer timer;
    size_t bytes = 0;
    for (const auto& op : pending_) bytes += static_cast<size_t>(op->count) * sizeof(float);
    wait_until([this] { return advance(); },
               options_.deterministic ? "overlapped deterministic all-reduce" : "overlapped all-reduce", bytes);
    pending_.clear();
    seconds_ += timer.seconds();
  }

  void all_gather(float* data, const std::vector<size_t>& bounds) override {
    ASTRAI_CHECK(bounds.size() == static_cast<size_t>(size_) + 1, "all_gather: ", bounds.size(), " bounds for ",
                 size_, " ranks");
    ASTRAI_CHECK(pending_.empty(), "all_gather while overlapped sums are pending");
    Timer timer;
    // Every owner broadcasts its slice (in chunks); all are started, then waited for together.
    std::vector<MPI_Request> reqs;
    size_t bytes = 0;
    for (int r = 0; r < size_; ++r) {
      for (size_t off = bounds[r]; off < bounds[r + 1]; off += kChunk) {
        const int count = static_cast<int>(std::min(kChunk, bounds[r + 1] - off));
        reqs.emplace_back();
        check(MPI_Ibcast(data + off, count, MPI_FLOAT, r, MPI_COMM_WORLD, &reqs.back()), "MPI_Ibcast");
        bytes += static_cast<size_t>(count) * sizeof(float);
      }
    }
    wait_all(reqs, "all-gather of the updated weights", bytes);
    bytes_ += static_cast<int64_t>((bounds[rank_ + 1] - bounds[rank_]) * sizeof(float));
    seconds_ += timer.seconds();
  }

  void gather_to_root(const float* mine, float* out, const std::vector<size_t>& bounds) override {
    ASTRAI_CHECK(bounds.size() == static_cast<size_t>(size_) + 1, "gather_to_root: ", bounds.size(), " bounds for ",
                 size_, " ranks");
    ASTRAI_CHECK(pending_.empty(), "gather_to_root while overlapped sums are pending");
    Timer timer;
    std::vector<MPI_Request> reqs;
    const size_t n_mine = bounds[rank_ + 1] - bounds[rank_];
    if (rank_ == 0) {
      if (n_mine > 0) std::memcpy(out + bounds[0], mine, n_mine * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        int tag = 0;
        for (size_t off = bounds[r]; off < bounds[r + 1]; off += kChunk, ++tag) {
          reqs.emplace_back();
          check(MPI_Irecv(out + off, static_cast<int>(std::min(kChunk, bounds[r + 1] - off)), MPI_FLOAT, r, tag,
                          gather_comm_, &reqs.back()),
                "MPI_Irecv");
        }
      }
    } else {
      int tag = 0;
      for (size_t off = 0; off < n_mine; off += kChunk, ++tag) {
        reqs.emplace_back();
        check(MPI_Isend(mine + off, static_cast<int>(std::min(kChunk, n_mine - off)), MPI_FLOAT, 0, tag, gather_comm_,
                        &reqs.back()),
              "MPI_Isend");
      }
    }
    wait_all(reqs, "gather of the optimizer state to rank 0", (rank_ == 0 ? bounds.back() : n_mine) * sizeof(float));
    bytes_ += static_cast<int64_t>(n_mine * sizeof(float));
    seconds_ += timer.seconds();
  }

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

  // One overlapped sum of up to kChunk floats: library (one MPI_Iallreduce) or deterministic
  // (MPI_Igather to rank 0; rank 0 sums in rank order; MPI_Ibcast).
  enum class Stage { kReduce, kGather, kGathered, kBroadcast, kDone };
  struct Pending {
    float* data = nullptr;
    int count = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    Stage stage = Stage::kReduce;
    std::vector<float> gathered;
  };

  // Advances the pending sums as far as they go without waiting; true when all are done. A
  // deterministic sum starts its broadcast only after every sum before it did, so the
  // broadcasts are started in the same order on every rank.
  bool advance() {
    bool all_done = true;
    bool blocked = false;  // an earlier sum has not started its broadcast yet
    for (auto& op : pending_) {
      if (op->stage == Stage::kDone) continue;
      if (op->stage != Stage::kGathered) {
        int done = 0;
        check(MPI_Test(&op->req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) op->stage = op->stage == Stage::kGather ? Stage::kGathered : Stage::kDone;
      }
      if (op->stage == Stage::kGathered && !blocked) {
        start_broadcast(*op);
        int done = 0;
        check(MPI_Test(&op->req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) op->stage = Stage::kDone;
      }
      if (op->stage != Stage::kDone) all_done = false;
      if (op->stage == Stage::kGather || op->stage == Stage::kGathered) blocked = true;
    }
    return all_done;
  }

  void start_broadcast(Pending& op) {
    if (rank_ == 0) sum_in_rank_order(op.gathered.data(), size_, static_cast<size_t>(op.count), op.data);
    op.gathered = {};
    op.stage = Stage::kBroadcast;
    check(MPI_Ibcast(op.data, op.count, MPI_FLOAT, 0, bcast_comm_, &op.req), "MPI_Ibcast");
  }

  void wait_all(std::vector<MPI_Request>& reqs, const char* what, size_t bytes) {
    wait_until(
        [&] {
          int done = 0;
          check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE), what);
          return done != 0;
        },
        what, bytes);
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
    wait_until(
        [&] {
          int done = 0;
          check(MPI_Test(req, &done, MPI_STATUS_IGNORE), what);
          return done != 0;
        },
        what, bytes);
  }

  void wait_until(const std::function<bool()>& done, const char* what, size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (done()) return;
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
  MPI_Comm gather_comm_ = MPI_COMM_NULL, bcast_comm_ = MPI_COMM_NULL;
  std::vector<std::unique_ptr<Pending>> pending_;
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
