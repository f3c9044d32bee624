// Runs one benchmark configuration in a child process (fork + exec of a benchmark binary), so that its peak RSS
// and CPU time are its own, and reads back the plain-old-data result the child writes to a pipe.
// The child is `exe args... --fd N`; it writes exactly sizeof(Out) bytes to descriptor N and exits 0.
#pragma once
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace trident::bench {

// True in the plain-sum twin of a benchmark (built against the TRIDENT_PLAIN_ACC libraries), which runs only as
// the child of its exact twin.
#ifdef TRIDENT_PLAIN_ACC
inline constexpr bool kPlainBuild = true;
#else
inline constexpr bool kPlainBuild = false;
#endif

struct ChildUsage {
  double user = 0, sys = 0;  // CPU seconds of the child
  long rss_kb = 0;           // its peak resident set (ru_maxrss)
};

// false when the child could not start, exited non-zero or wrote no result.
template <class Out>
bool run_child(const std::string& exe, std::vector<std::string> args, Out& out, ChildUsage& u) {
  static_assert(std::is_trivially_copyable_v<Out>);
  int fd[2];
  if (pipe(fd) != 0) {
    std::perror("pipe");
    return false;
  }
  args.insert(args.begin(), exe);
  args.push_back("--fd");
  args.push_back(std::to_string(fd[1]));
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    std::perror(("exec " + exe).c_str());
    _exit(127);
  }
  close(fd[1]);
  const bool got = pid > 0 && read(fd[0], &out, sizeof out) == static_cast<ssize_t>(sizeof out);
  close(fd[0]);
  if (pid < 0) {
    std::perror("fork");
    return false;
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  u.user = static_cast<double>(ru.ru_utime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec);
  u.sys = static_cast<double>(ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_stime.tv_usec);
  u.rss_kb = ru.ru_maxrss;
  return got && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The child's side: writes `out` to the descriptor the parent passed.
template <class Out>
bool write_result(int fd, const Out& out) {
  static_assert(std::is_trivially_copyable_v<Out>);
  if (write(fd, &out, sizeof out) == static_cast<ssize_t>(sizeof out)) return true;
  std::perror("write");
  return false;
}

}  // namespace trident::bench
