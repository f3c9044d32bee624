// Process control: this executable's path, starting a copy of it, and what a forked child may ask of the kernel.
//
// executable_path(): Linux reads /proc/self/exe, macOS asks _NSGetExecutablePath. self_exec_path(): what to start
// to run this very binary again: /proc/self/exe on Linux by default (the running file even if it was replaced on
// disk since), executable_path() with TRIDENT_PORTABLE and elsewhere. spawn(): posix_spawn.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace trident::platform {

// The absolute path of the running executable ("" where it cannot be found).
std::string executable_path();
// A path that execs this executable (see above).
std::string self_exec_path();

// Starts `path` with argv (argv[0] included) and this process's environment with `env` set on top (each
// name=value replaces the same name). Returns the child's pid (> 0), or -1 with `err` saying why.
long spawn(const std::string& path, const std::vector<std::string>& argv,
           const std::vector<std::pair<std::string, std::string>>& env, std::string& err);

// In a child right after fork(): asks the kernel to kill it (SIGKILL) when its parent exits. Linux only (prctl
// PR_SET_PDEATHSIG); returns false elsewhere, where the caller relies on its own checks (getppid, time limits).
bool die_with_parent();

// pipe() with both ends close-on-exec (pipe2 where it exists). false on failure (errno set).
bool pipe_cloexec(int fds[2]);

}  // namespace trident::platform
