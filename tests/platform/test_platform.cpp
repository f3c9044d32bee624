// platform/: each concern through its one interface (docs/laptops.md).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "platform/context.h"
#include "platform/memory_info.h"
#include "platform/process.h"
#include "platform/wait.h"

namespace {

using namespace trident::platform;

struct WaitImpl {
  const char* name;
  void (*wait)(std::atomic<uint32_t>&, uint32_t);
  void (*wake)(std::atomic<uint32_t>&, int);
};
const WaitImpl kWaits[] = {{"selected", &wait_word, &wake_word}, {"condvar", &condvar_wait, &condvar_wake}};

TEST(PlatformWait, PingPongLosesNoWake) {
  std::printf("wait: %s, context switch: %s\n", wait_impl(), context_impl());
  for (const WaitImpl& impl : kWaits) {
    SCOPED_TRACE(impl.name);
    // Two threads hand a token back and forth 20,000 times, each sleeping on its own word: a lost wake hangs.
    std::atomic<uint32_t> a{0}, b{0};
    const uint32_t rounds = 20000;
    std::thread t([&] {
      for (uint32_t i = 0; i < rounds; ++i) {
        impl.wait(a, i);
        b.store(i + 1, std::memory_order_release);
        impl.wake(b, 1);
      }
    });
    for (uint32_t i = 0; i < rounds; ++i) {
      a.store(i + 1, std::memory_order_release);
      impl.wake(a, 1);
      impl.wait(b, i);
    }
    t.join();
    EXPECT_EQ(a.load(), rounds);
    EXPECT_EQ(b.load(), rounds);
  }
}

TEST(PlatformWait, WakeAllReachesEveryWaiter) {
  for (const WaitImpl& impl : kWaits) {
    SCOPED_TRACE(impl.name);
    std::atomic<uint32_t> gate{0};
    std::atomic<int> through{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 16; ++i)
      ts.emplace_back([&] {
        impl.wait(gate, 0);
        through.fetch_add(1);
      });
    gate.store(1, std::memory_order_release);
    impl.wake(gate, INT_MAX);
    for (auto& t : ts) t.join();
    EXPECT_EQ(through.load(), 16);
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // a raw switch needs the sanitizer annotations emulator/fiber.cpp adds
#else
constexpr bool kSanitized = false;
#endif

struct PingPong {
  MachineContext main, co;
  int count = 0;
  double x = 1.0;
};

void co_body(void* p) {
  auto* s = static_cast<PingPong*>(p);
  for (;;) {
    ++s->count;
    s->x = s->x * 3.0 + 1.0;  // callee-saved FP registers and the FP state survive the switch
    switch_context(s->co, s->main);
  }
}

TEST(PlatformContext, SwitchesBackAndForth) {
  if (kSanitized) GTEST_SKIP() << "covered through the fiber scheduler (test_emulator_fibers) under sanitizers";
  Stack st;
  ASSERT_EQ(allocate_stack(64 * 1024, st), "");
  ASSERT_NE(st.bottom, nullptr);
  EXPECT_GE(st.size, 64u * 1024);
  PingPong s;
  make_context(s.co, st.bottom, st.size, &co_body, &s);
  double expect = 1.0;
  const double local = 0.1 * 7;  // lives in a register across the switch
  for (int i = 1; i <= 1000; ++i) {
    switch_context(s.main, s.co);
    expect = expect * 3.0 + 1.0;
    ASSERT_EQ(s.count, i);
  }
  EXPECT_EQ(s.x, expect);
  EXPECT_EQ(local, 0.1 * 7);
  free_stack(st);  // the context is abandoned suspended: nothing on its stack needs unwinding
  EXPECT_EQ(st.map, nullptr);
}

TEST(PlatformProcess, ExecutablePathAndSpawn) {
  const std::string self = executable_path();
  ASSERT_FALSE(self.empty());
  EXPECT_TRUE(std::filesystem::exists(self));
  EXPECT_EQ(std::filesystem::path(self).filename(), "test_platform");
  EXPECT_TRUE(std::filesystem::exists(self_exec_path()));
  // The child sees the given variables on top of this environment (PATH kept).
  std::string err;
  const long pid = spawn("/bin/sh", {"sh", "-c", "test \"$TRIDENT_PLATFORM_T\" = yes && test -n \"$PATH\""},
                         {{"TRIDENT_PLATFORM_T", "yes"}}, err);
  ASSERT_GT(pid, 0) << err;
  int status = 0;
  ASSERT_EQ(::waitpid(static_cast<pid_t>(pid), &status, 0), static_cast<pid_t>(pid));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(spawn("/nonexistent/trident-platform-test", {"x"}, {}, err), -1);
  EXPECT_NE(err.find("/nonexistent/trident-platform-test"), std::string::npos) << err;
}

TEST(PlatformProcess, PipeIsCloseOnExec) {
  int fds[2];
  ASSERT_TRUE(pipe_cloexec(fds));
  for (int fd : fds) {
    EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    ::close(fd);
  }
}

TEST(PlatformMemory, Queries) {
  std::vector<char> touched(32 << 20);
  std::memset(touched.data(), 1, touched.size());
  const int64_t rss = peak_rss_bytes();
  EXPECT_GE(rss, int64_t{32} << 20) << "peak RSS after touching 32 MiB";
  EXPECT_LT(rss, int64_t{1} << 40);
  const double avail = available_memory_bytes();
  EXPECT_GT(avail, 0);
  std::printf("peak RSS %.1f MiB, available %.1f GiB\n", static_cast<double>(rss) / (1 << 20), avail / (1 << 30));
  EXPECT_EQ(touched[12345], 1);
}

TEST(PlatformMemory, SharedPagesAndCpuTime) {
  // 32 MiB of private anonymous memory must not count as shared (the file pages counted depend on the build: none
  // were counted under AddressSanitizer).
  const int64_t before = shared_rss_bytes();
  std::vector<char> touched(32 << 20);
  std::memset(touched.data(), 1, touched.size());
  const int64_t after = shared_rss_bytes();
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  EXPECT_GE(before, 0);
  EXPECT_LT(after - before, int64_t{16} << 20) << "private pages counted as shared";
  EXPECT_LT(after, peak_rss_bytes());
#else
  EXPECT_EQ(before, 0);
  EXPECT_EQ(after, 0);
#endif
  const double c0 = cpu_seconds();
  volatile double x = 0;
  for (int i = 0; i < 50'000'000; ++i) x = x + 1e-9 * i;
  const double c1 = cpu_seconds();
  EXPECT_GT(c1, c0) << "50 M additions took no CPU time";
  EXPECT_LT(c1 - c0, 60.0);
  EXPECT_EQ(touched[777], 1);
}

}  // namespace
