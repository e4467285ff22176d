#include "dashboard/metrics_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace astrai::dashboard {

MetricsTail::MetricsTail(std::string path) : path_(std::move(path)) {}

void MetricsTail::start_over() {
  read_pos_ = 0;
  partial_.clear();
  lines_.clear();
  skipped_ = 0;
  ++generation_;
}

bool MetricsTail::poll() {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    exists_ = false;  // keep the lines already read: a replacement appears under the name at once
    return false;
  }
  bool changed = false;
  const bool other_file = !exists_ || st.st_ino != inode_ || st.st_dev != device_;
  if (other_file || st.st_size < read_pos_) {
    start_over();
    changed = true;
    exists_ = true;
    device_ = st.st_dev;
    inode_ = st.st_ino;
  }
  if (st.st_size == read_pos_) return changed;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return changed;  // replaced or removed between stat and open: the next poll sees it
  const size_t before = lines_.size();
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, read_pos_);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    read_pos_ += n;
    partial_.append(buf, static_cast<size_t>(n));
    take_complete_lines();
  }
  ::close(fd);
  return changed || lines_.size() != before;
}

void MetricsTail::take_complete_lines() {
  size_t start = 0;
  for (size_t nl = partial_.find('\n'); nl != std::string::npos; nl = partial_.find('\n', start)) {
    std::string_view line(partial_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    start = nl + 1;
    if (line.empty()) continue;
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) lines_.emplace_back(line);
    else ++skipped_;
  }
  partial_.erase(0, start);
}

std::vector<Json> read_metrics_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": ", std::strerror(errno), " (not a training output directory?)");
  MetricsTail tail(path);
  tail.poll();
  std::vector<Json> records;
  records.reserve(tail.lines().size() + 1);
  for (const std::string& line : tail.lines()) records.push_back(Json::parse(line));
  // A finished file whose writer stopped before the newline: its last record if complete.
  const Json last = Json::parse(tail.pending(), nullptr, false);
  if (last.is_object()) records.push_back(last);
  ASTRAI_CHECK(!records.empty(), path, " holds no metrics records yet (",
               st.st_size == 0 ? std::string("empty file") : str_cat(tail.skipped_lines(), " unreadable lines"), ")");
  return records;
}

}  // namespace astrai::dashboard
