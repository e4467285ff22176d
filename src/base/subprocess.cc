#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/error.h"

extern char** environ;

namespace astrai {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void make_pipe(Fd* read_end, Fd* write_end) {
  int p[2];
  ASTRAI_CHECK(::pipe2(p, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno));
  read_end->fd = p[0];
  write_end->fd = p[1];
}

pid_t spawn_shell(const std::string& command, int stdin_fd, int stdout_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, stdin_fd, 0);
  posix_spawn_file_actions_adddup2(&actions, stdout_fd, 1);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  ASTRAI_CHECK(rc == 0, "cannot start `", command, "`: ", std::strerror(rc));
  return pid;
}

}  // namespace

SubprocessResult run_shell(const std::string& command, const std::string& input, double timeout_seconds) {
  ::signal(SIGPIPE, SIG_IGN);
  Fd in_read, in_write, out_read, out_write;
  make_pipe(&in_read, &in_write);
  make_pipe(&out_read, &out_write);
  const pid_t pid = spawn_shell(command, in_read.fd, out_write.fd);
  in_read.close();
  out_write.close();
  ::fcntl(in_write.fd, F_SETFL, O_NONBLOCK);
  if (input.empty()) in_write.close();

  SubprocessResult r;
  size_t written = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  char buf[4096];
  while (out_read.fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_read.fd, POLLIN, 0}, {in_write.fd, POLLOUT, 0}};
    const int n = ::poll(fds, in_write.fd >= 0 ? 2 : 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
      const ssize_t w = ::write(in_write.fd, input.data() + written, input.size() - written);
      if (w > 0) written += static_cast<size_t>(w);
      if (w < 0 && errno != EAGAIN) written = input.size();  // the child closed its stdin
      if (written == input.size()) in_write.close();
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t got = ::read(out_read.fd, buf, sizeof buf);
      if (got > 0) r.out.append(buf, static_cast<size_t>(got));
      else if (got == 0 || errno != EINTR) out_read.close();
    }
  }
  in_write.close();
  // stdout is closed; the child may still run (it closed stdout early): the same deadline.
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, r.timed_out ? 0 : WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    if (w == 0 && std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
    } else if (w == 0) {
      ::usleep(1000);
    }
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

}  // namespace astrai
