// Incremental reader of one run's metrics.jsonl (written by `astrai train`, one JSON object per
// line, appended after every update). poll() reads only the bytes added since the last call,
// by byte offset; a last line without its newline (the trainer is writing it) waits for the
// next poll. The trainer replaces the file when a run starts or resumes (a new inode, possibly
// shorter): the reader then starts over and counts a new generation, so a client that holds
// lines of the old one knows to drop them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"

namespace astrai::dashboard {

class MetricsTail {
 public:
  explicit MetricsTail(std::string path);

  // Reads what was appended (or starts over on a replaced/truncated file). True when lines()
  // or generation() changed. A missing file is not an error: the run may not have started.
  bool poll();

  const std::string& path() const { return path_; }
  bool exists() const { return exists_; }
  // The complete lines read so far that are JSON objects, as written (one record each).
  const std::vector<std::string>& lines() const { return lines_; }
  // 1 for the first content seen; +1 each time the file was replaced or truncated.
  uint64_t generation() const { return generation_; }
  // Complete lines that were not JSON objects (skipped).
  int64_t skipped_lines() const { return skipped_; }
  // Bytes after the last newline: a line still being written.
  const std::string& pending() const { return partial_; }

 private:
  void start_over();
  void take_complete_lines();

  std::string path_;
  bool exists_ = false;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  int64_t read_pos_ = 0;  // bytes of the file read so far
  std::string partial_;   // the bytes read after the last newline
  std::vector<std::string> lines_;
  uint64_t generation_ = 0;
  int64_t skipped_ = 0;
};

// Every record of a finished run's metrics.jsonl, parsed. Throws astrai::Error naming the
// file when it does not exist or holds no record.
std::vector<Json> read_metrics_file(const std::string& path);

}  // namespace astrai::dashboard
