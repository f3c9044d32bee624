// platform/process.h.
#include "platform/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#if defined(__linux__)
#include <sys/prctl.h>
#include <csignal>
#endif
#if defined(__APPLE__)
#include <mach-o/dyld.h>
#endif

extern char** environ;

namespace trident::platform {

std::string executable_path() {
#if defined(__linux__)
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
#elif defined(__APPLE__)
  uint32_t n = 0;
  _NSGetExecutablePath(nullptr, &n);
  std::string buf(n, '\0');
  if (_NSGetExecutablePath(buf.data(), &n) != 0) return "";
  buf.resize(std::strlen(buf.c_str()));
  char real[PATH_MAX];
  return ::realpath(buf.c_str(), real) ? std::string(real) : buf;
#else
  return "";
#endif
}

std::string self_exec_path() {
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  return "/proc/self/exe";
#else
  return executable_path();
#endif
}

long spawn(const std::string& path, const std::vector<std::string>& argv,
           const std::vector<std::pair<std::string, std::string>>& env, std::string& err) {
  if (path.empty()) {
    err = "the path of this executable is unknown on this system";
    return -1;
  }
  // The environment: this process's, with env's names replaced (order kept, new names last).
  std::vector<std::string> envs;
  std::map<std::string, std::string> over(env.begin(), env.end());
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (!over.count(name)) envs.emplace_back(*e);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<std::string> args = argv;
  std::vector<char*> av, ev;
  for (std::string& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  for (std::string& e : envs) ev.push_back(e.data());
  ev.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, path.c_str(), nullptr, nullptr, av.data(), ev.data());
  if (rc != 0) {
    err = fmt::format("posix_spawn of {} failed: {}", path, std::strerror(rc));
    return -1;
  }
  return static_cast<long>(pid);
}

bool die_with_parent() {
#if defined(__linux__)
  return ::prctl(PR_SET_PDEATHSIG, SIGKILL) == 0;
#else
  return false;
#endif
}

bool pipe_cloexec(int fds[2]) {
#if defined(__linux__)
  return ::pipe2(fds, O_CLOEXEC) == 0;
#else
  if (::pipe(fds) != 0) return false;
  for (int i = 0; i < 2; ++i)
    if (::fcntl(fds[i], F_SETFD, FD_CLOEXEC) != 0) {
      const int e = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      errno = e;
      return false;
    }
  return true;
#endif
}

}  // namespace trident::platform
