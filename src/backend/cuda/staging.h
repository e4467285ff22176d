// How index arrays reach the device, and the modes a cached step runs in (cuda_ops.cu's
// run_cached): Stager (one pinned host buffer, copies on the backend's stream, uploads logged
// at capture and checked when a replay is prepared) and DeviceArray (a reusable device array
// that skips an upload equal to its last).
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"

namespace astrai::backend::cuda {
namespace {

// How the operations run: kRun issues the work; kCapture records it into a CUDA graph (nothing
// runs); kPrepare does only the host side of each operation (its index arrays go to the same
// staging places the captured graph copies from) and issues nothing: the graph then replays.
enum class Mode { kRun, kCapture, kPrepare };

// Index arrays go to the device through one pinned host buffer: written at a cursor, copied
// by cudaMemcpyAsync on the backend's stream. The cursor restarts only after the stream has
// drained (a wrap, or the start of a cached step), so a pending copy never reads overwritten
// bytes. Within a cached step the uploads are logged (kCapture) and checked (kPrepare): a
// replay is valid only when every upload has the destination, place and size it had when the
// graph was captured.
class Stager {
 public:
  struct Upload {
    const void* dst;
    size_t offset, bytes;
  };
  Stager() = default;
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;
  ~Stager() { cudaFreeHost(host_); }

  // Starts a cached step: the stream has drained, so the buffer restarts at 0.
  void begin_step() {
    ++step_;
    cursor_ = 0;
    step_bytes_ = 0;
    checked_ = 0;
    matches_ = true;
  }
  void put(void* dst, const void* src, size_t bytes, Mode mode, cudaStream_t stream) {
    if (bytes == 0) return;
    const size_t span = (bytes + 63) / 64 * 64;
    step_bytes_ += span;
    if (mode == Mode::kRun) {
      if (cursor_ + span > capacity_) {
        check_cuda(cudaStreamSynchronize(stream), "staging: waiting for earlier copies");
        cursor_ = 0;
        if (span > capacity_) grow(span);
      }
    } else if (cursor_ + span > capacity_) {
      // A capture or replay cannot wait or reallocate; the step runs uncached (the run before
      // a capture sizes the buffer, so this is rare).
      matches_ = false;
      return;
    }
    if (mode == Mode::kPrepare) {
      matches_ = matches_ && checked_ < log_.size() && log_[checked_].dst == dst &&
                 log_[checked_].offset == cursor_ && log_[checked_].bytes == bytes;
      ++checked_;
    }
    std::memcpy(host_ + cursor_, src, bytes);
    if (mode != Mode::kPrepare)
      check_cuda(cudaMemcpyAsync(dst, host_ + cursor_, bytes, cudaMemcpyHostToDevice, stream), "upload");
    if (mode == Mode::kCapture) log_.push_back(Upload{dst, cursor_, bytes});
    cursor_ += span;
  }
  // Scratch a cached step's kernels use: logged when captured and checked when prepared like an
  // upload of no bytes, so a graph whose scratch has moved since is not replayed.
  void note(const void* scratch, Mode mode) {
    if (mode == Mode::kCapture) log_.push_back(Upload{scratch, kScratch, 0});
    if (mode == Mode::kPrepare) {
      matches_ = matches_ && checked_ < log_.size() && log_[checked_].dst == scratch && log_[checked_].offset == kScratch;
      ++checked_;
    }
  }
  // After a kRun step: room for a step of that size without a wrap (the stream has drained).
  void fit_step() {
    if (step_bytes_ > capacity_) grow(step_bytes_);
  }
  void start_log() { log_.clear(); }
  void invalidate() { matches_ = false; }
  // Whether the prepared step made exactly the captured uploads.
  bool prepared_matches() const { return matches_ && checked_ == log_.size(); }
  bool capture_fits() const { return matches_; }
  // Counts cached steps (an upload within one may reuse that step's earlier copy).
  uint64_t step() const { return step_; }
  // Changes whenever the buffer moves (graphs copying from the old one are stale).
  uint64_t generation() const { return generation_; }

 private:
  void grow(size_t bytes) {
    check_cuda(cudaFreeHost(host_), "staging: free");
    host_ = nullptr;
    capacity_ = std::max<size_t>({bytes, 2 * capacity_, size_t(1) << 20});
    check_cuda(cudaMallocHost(&host_, capacity_), "staging: pinned host memory");
    cursor_ = 0;
    ++generation_;
  }
  static constexpr size_t kScratch = ~size_t(0);  // the offset of a scratch entry
  char* host_ = nullptr;
  size_t capacity_ = 0, cursor_ = 0, step_bytes_ = 0;
  std::vector<Upload> log_;
  size_t checked_ = 0;
  bool matches_ = true;
  uint64_t generation_ = 0;
  uint64_t step_ = 0;
};

// A device array that grows on demand and is reused.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  // Room for n elements (kRun only: the others must not allocate; their sizes were settled
  // by the run before the capture, and a prepared step that needs more no longer matches).
  T* reserve(size_t n) {
    if (n > capacity_) {
      check_cuda(cudaFree(data_), "free");
      data_ = nullptr;
      last_.clear();
      check_cuda(cudaMalloc(&data_, n * sizeof(T)), "allocating scratch");
      capacity_ = n;
    }
    return data_;
  }
  T* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // The host values on the device. Every layer of a forward sends the same step's indices:
  // when they equal the last upload, the device copy is reused (one copy per step, not per
  // layer). In a cached step only a copy made earlier in that step counts (the graph holds
  // its first copy), and the reuse is noted, so a prepared step that would copy where the
  // capture reused (or the reverse) does not replay.
  const T* upload(const T* host, size_t count, Stager& stager, Mode mode, cudaStream_t stream) {
    const size_t bytes = count * sizeof(T);
    const bool same = data_ != nullptr && bytes == last_.size() && std::memcmp(host, last_.data(), bytes) == 0;
    if (same && mode == Mode::kRun) return data_;
    if (same && last_step_ == stager.step()) {
      stager.note(data_, mode);
      return data_;
    }
    if (count > capacity_ && mode != Mode::kRun) {
      stager.invalidate();  // the graph no longer fits this step: it runs uncached
      if (mode == Mode::kCapture) return data_;  // no allocation while capturing; discarded
    }
    T* d = reserve(std::max<size_t>(count, 1));
    stager.put(d, host, bytes, mode, stream);
    last_.assign(reinterpret_cast<const char*>(host), reinterpret_cast<const char*>(host) + bytes);
    last_step_ = stager.step();
    return d;
  }
  // The device copy is unknown (a cached step's copies did not run): the next upload copies.
  void forget() { last_.clear(); }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
  std::vector<char> last_;  // the bytes last uploaded
  uint64_t last_step_ = ~uint64_t(0);  // the stager's step they were uploaded in
};

}  // namespace
}  // namespace astrai::backend::cuda
