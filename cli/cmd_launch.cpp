// `trident launch`: N local processes of this trident, one per GPU, each told its place the way torchrun does
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the multi-process launch of
// `emulate --backend nccl` (docs/gpu.md "Multi-process launch"). It waits for all of them; when one fails, the
// others get --grace seconds to fail on their own (a peer's error reaches them through NCCL) and are then stopped
// (SIGTERM, then SIGKILL), so a dead rank never leaves the job hanging. Exit status 0 when every process exits 0.
// The processes are this executable started again with posix_spawn (platform/process.h).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "gpu/nccl/nccl_bootstrap.h"
#include "platform/process.h"
#include "reference/check.h"

namespace {

using namespace trident;
using Clock = std::chrono::steady_clock;

// SIGTERM, SIGINT or SIGHUP to the launcher (a scheduler's timeout, Ctrl-C): the job is stopped like a failed one,
// with no grace, so no process outlives the launcher.
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }

struct Opts {
  int64_t nproc = 1;
  int64_t port = 0;  // 0: a free port of this machine
  std::string addr = "127.0.0.1";
  double grace = 10;
  double timeout = 0;  // 0: none
  std::vector<std::string> args;
};

// A port nobody listens on now (bound to port 0 and released; rank 0 binds it again when the job starts).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail(fmt::format("launch: socket() failed: {}", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  if (!ok) fail(fmt::format("launch: no free TCP port: {} (give --master-port)", std::strerror(errno)));
  return ntohs(a.sin_port);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

// --grace and --timeout: finite, not negative, at most `max` seconds; else "" becomes the error message.
std::string check_seconds(const char* flag, double v, double max) {
  if (std::isfinite(v) && v >= 0 && v <= max) return "";
  return fmt::format("launch: {} {}: expected a number of seconds from 0 to {}", flag, v, max);
}

int launch(const Opts& o) {
  if (o.args.empty()) fail("launch: no command: `trident launch --nproc N -- emulate --backend nccl ...`");
  if (o.args.front() == "launch") fail("launch: the command must not be `launch` itself");
  const int port = o.port > 0 ? static_cast<int>(o.port) : free_port();
  // The job's secret: only processes started here can prove it and receive NCCL's unique id (docs/security.md).
  const std::string secret = nccl::make_job_secret();
  std::vector<std::string> argv = {"trident"};
  argv.insert(argv.end(), o.args.begin(), o.args.end());
  const std::string exe = platform::self_exec_path();
  std::printf("launch: %lld processes (RANK 0..%lld, MASTER_ADDR %s, MASTER_PORT %d): trident",
              static_cast<long long>(o.nproc), static_cast<long long>(o.nproc - 1), o.addr.c_str(), port);
  for (const std::string& a : o.args) std::printf(" %s", a.c_str());
  std::printf("\n");
  std::fflush(stdout);
  std::fflush(stderr);
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < o.nproc; ++r) {
    // Its place in the job, on top of this process's environment.
    const std::string n = std::to_string(o.nproc), rs = std::to_string(r), ps = std::to_string(port);
    const std::vector<std::pair<std::string, std::string>> env = {
        {"RANK", rs},        {"LOCAL_RANK", rs},      {"WORLD_SIZE", n},       {"LOCAL_WORLD_SIZE", n},
        {"MASTER_ADDR", o.addr}, {"MASTER_PORT", ps},
        {"TRIDENT_NCCL_ID_PORT", ps},  // nothing else of this job listens on MASTER_PORT
        {"TRIDENT_JOB_SECRET", secret}};
    std::string err;
    const long spawned = platform::spawn(exe, argv, env, err);
    if (spawned <= 0) {
      for (const auto& [p, rr] : rank_of) ::kill(p, SIGKILL);
      for (const auto& [p, rr] : rank_of) ::waitpid(p, nullptr, 0);
      fail(fmt::format("launch: rank {}: {}", r, err));
    }
    const auto pid = static_cast<pid_t>(spawned);
    rank_of[pid] = r;
  }

  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
  const auto t0 = Clock::now();
  std::string first_failure;
  Clock::time_point failed_at{};
  bool termed = false, killed = false;
  std::vector<std::string> stopped;
  const auto secs = [](double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  while (!rank_of.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const auto it = rank_of.find(pid);
      if (it == rank_of.end()) continue;
      const int r = it->second;
      rank_of.erase(it);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (termed) stopped.push_back(std::to_string(r));
      else if (!ok && first_failure.empty()) {
        first_failure = fmt::format("rank {} {}", r, describe(status));
        failed_at = Clock::now();
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    const auto now = Clock::now();
    if (g_signal != 0 && first_failure.empty()) {
      first_failure = fmt::format("the launcher got signal {} ({})", static_cast<int>(g_signal),
                                  strsignal(static_cast<int>(g_signal)));
      failed_at = now - secs(o.grace);  // no grace: stop everyone now
    }
    if (o.timeout > 0 && first_failure.empty() && now - t0 > secs(o.timeout)) {
      first_failure = fmt::format("the job timed out after {} s (--timeout)", o.timeout);
      failed_at = now - secs(o.grace);  // no grace: stop everyone now
    }
    if (!first_failure.empty() && !termed && now - failed_at >= secs(o.grace)) {
      for (const auto& [p, r] : rank_of) ::kill(p, SIGTERM);
      termed = true;
    }
    if (termed && !killed && now - failed_at >= secs(o.grace + 5)) {
      for (const auto& [p, r] : rank_of) ::kill(p, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double el = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!first_failure.empty()) {
    std::string also;
    if (!stopped.empty()) {
      also = "; stopped by the launcher: rank";
      for (const std::string& r : stopped) also += " " + r;
    }
    fail(fmt::format("launch: {} after {:.1f} s{}", first_failure, el, also));
  }
  std::printf("launch: %lld processes exited with status 0 in %.1f s\n", static_cast<long long>(o.nproc), el);
  return 0;
}

}  // namespace

TRIDENT_COMMAND({"launch", "start N local processes of a trident command, one per GPU, with torchrun's variables "
                           "(the multi-process launch of `emulate --backend nccl`)",
                 [](CLI::App& sub) -> trident::cli::Action {
                   auto o = std::make_shared<Opts>();
                   sub.footer(
                       "Example: trident launch --nproc 8 -- emulate --backend nccl --kernels cuda-ref "
                       "--mesh fsdp=2,cp=2,e_fsdp=2,ep=2 --check-reference\n"
                       "Each process gets RANK, LOCAL_RANK (its GPU), WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and "
                       "MASTER_PORT; rank 0 hands NCCL's unique id to the others over MASTER_ADDR:MASTER_PORT, each proving "
                       "the job's secret (TRIDENT_JOB_SECRET, made here per job; docs/security.md). "
                       "One node; across nodes start each node's processes with torchrun or mpirun and the same "
                       "variables (docs/gpu.md).");
                   sub.add_option("--nproc", o->nproc, "processes to start (one per GPU of this node)")
                       ->check(CLI::Range(int64_t{1}, int64_t{4096}))
                       ->required();
                   sub.add_option("--master-port", o->port, "MASTER_PORT (default: a free port of this machine)")
                       ->check(CLI::Range(int64_t{1}, int64_t{65535}));
                   sub.add_option("--master-addr", o->addr, "MASTER_ADDR")->capture_default_str();
                   // The help shows each range; the check is in the action (CLI11's range check lets nan through and
                   // would exit 1): one line, exit 2.
                   const auto range_shown = [](std::string desc) {
                     return CLI::Validator([](std::string&) { return std::string(); }, std::move(desc));
                   };
                   sub.add_option("--grace", o->grace,
                                  "seconds the other processes get to end after one failed, before SIGTERM "
                                  "(then SIGKILL 5 s later)")
                       ->check(range_shown("FLOAT in [0 - 3600]"))
                       ->capture_default_str();
                   sub.add_option("--timeout", o->timeout, "stop the whole job after this many seconds (0: never)")
                       ->check(range_shown("FLOAT in [0 - 1e+07]"))
                       ->capture_default_str();
                   sub.add_option("command", o->args, "the trident command every process runs, after --")
                       ->required();
                   return [o]() -> int {
                     for (const std::string& e : {check_seconds("--grace", o->grace, 3600),
                                                  check_seconds("--timeout", o->timeout, 1e7)})
                       if (!e.empty()) {
                         std::fprintf(stderr, "trident: error: %s\n", e.c_str());
                         return 2;
                       }
                     return launch(*o);
                   };
                 }});
