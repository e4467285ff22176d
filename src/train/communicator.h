// Data-parallel communication for the trainer: sums gradients and scalars across the ranks of
// `mpirun -np N astrai train` between accumulation and the optimizer step (blocking, or started
// during the backward and waited for after it), and with --shard-optimizer (ZeRO-1) all-gathers
// the ranks' updated slices of the weights and gathers the optimizer state for checkpoints.
//
// make_communicator() picks the implementation: LocalCommunicator (the identity) for a plain
// process, and the MPI communicator (communicator.cc) when a launcher started more than one
// process (env OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_STEP_NUM_TASKS > 1). MPI is initialised
// only then, so a plain `astrai train` never touches it; a build without MPI fails such a
// launch with a clear error instead of training N unrelated copies.
//
// Every collective of the MPI communicator is non-blocking and polled against a deadline
// (--collective-timeout): a rank that died or stalls makes the others fail with an error
// naming the operation, not hang. With `deterministic` the sums are taken in rank order
// (gather to rank 0, ((x0 + x1) + x2) + ..., broadcast), so two runs with the same number of
// ranks give the same bits whatever reduction algorithm the MPI library would have chosen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace astrai::train {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Processes of this job on this machine (threads per rank default to cores / local_size).
  virtual int local_size() const { return 1; }
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;

  // Non-blocking sums (the gradient all-reduce overlapped with the backward): start_ starts
  // the sum of data[0, n) across ranks (data must not be touched until finish), progress()
  // lets the started ones advance (MPI moves a non-blocking collective only inside MPI calls),
  // finish_all_reduces() waits for every started one (against --collective-timeout). Every
  // rank starts the same sums in the same order. The bits equal all_reduce_sum's of the same
  // (data, n): the same calls per 4 Mi-element chunk, only started earlier.
  virtual void start_all_reduce_sum(float* data, size_t n) { all_reduce_sum(data, n); }
  virtual void progress() {}
  virtual void finish_all_reduces() {}

  // ZeRO-1 (train/shards.h), with bounds[r] .. bounds[r + 1] the floats rank r owns (ranks + 1
  // offsets): all_gather gives every rank every rank's slice of data (in place, exact copies);
  // gather_to_root copies each rank's slice (`mine`: bounds[r + 1] - bounds[r] floats) into
  // out[bounds[r] ..] on rank 0 (out: bounds.back() floats there; ignored on other ranks).
  virtual void all_gather(float* data, const std::vector<size_t>& bounds) = 0;
  virtual void gather_to_root(const float* mine, float* out, const std::vector<size_t>& bounds) = 0;
  // Ends every rank after an error on this one (MPI_Abort) with `what` on stderr; returns
  // (and the caller rethrows) when there is nobody else to stop.
  virtual void abort_all(const std::string& /*what*/) {}

  // Time spent in collectives and bytes this rank contributed to them, since construction.
  double seconds() const { return seconds_; }
  int64_t bytes() const { return bytes_; }

 protected:
  double seconds_ = 0.0;
  int64_t bytes_ = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void all_gather(float*, const std::vector<size_t>&) override {}
  void gather_to_root(const float* mine, float* out, const std::vector<size_t>& bounds) override;
};

struct CommunicatorOptions {
  bool deterministic = false;  // rank-ordered sums (--deterministic-allreduce)
  double timeout_s = 600.0;    // per collective; <= 0 waits forever (--collective-timeout)
};

// The number of processes the launcher started (1 for a plain process).
int launched_world_size();

// LocalCommunicator for a plain process, else the MPI communicator (MPI initialised here and
// finalised when it is destroyed); a multi-process launch of a build without MPI is an error.
std::unique_ptr<Communicator> make_communicator(const CommunicatorOptions& options);

// out[i] = (((x_0[i] + x_1[i]) + x_2[i]) + ...) for x_r = gathered + r * n: the fixed-order
// sum of the deterministic all-reduce.
template <typename T>
void sum_in_rank_order(const T* gathered, int ranks, size_t n, T* out) {
  for (size_t i = 0; i < n; ++i) out[i] = gathered[i];
  for (int r = 1; r < ranks; ++r) {
    const T* x = gathered + static_cast<size_t>(r) * n;
    for (size_t i = 0; i < n; ++i) out[i] += x[i];
  }
}

}  // namespace astrai::train
