// NCCL's unique id goes only to the job's own ranks (gpu/nccl/nccl_bootstrap.h, docs/security.md section 2):
// strangers that connect first, send garbage or hold a connection open neither delay nor break the exchange and get
// no byte of the id; a wrong secret, a replayed or forged reply, a duplicate rank and a missing secret on a
// non-loopback address are refused with one error each.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/nccl/nccl_bootstrap.h"
#include "reference/check.h"

using namespace trident;
using clk = std::chrono::steady_clock;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";

nccl::UniqueId test_id(char c) {
  nccl::UniqueId id;
  std::memset(id.internal, c, nccl::kUniqueIdBytes);
  return id;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A raw connection to 127.0.0.1:port, retried until rank 0 listens.
int connect_raw(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  for (int i = 0; i < 500; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

// Everything the peer sends until it closes or `ms` pass.
std::string drain(int fd, int ms) {
  std::string got;
  const auto until = clk::now() + std::chrono::milliseconds(ms);
  while (clk::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char b[256];
    const ssize_t k = ::recv(fd, b, sizeof b, 0);
    if (k <= 0) break;
    got.append(b, static_cast<size_t>(k));
  }
  return got;
}

struct Outcome {
  std::vector<std::string> errors;
  std::vector<bool> got_id;
  double seconds = 0;
};

// ranks 0..n-1 on threads, each with its own secret.
Outcome run_ranks(int port, int n, const std::vector<std::string>& secrets, std::chrono::milliseconds timeout) {
  Outcome o;
  o.errors.resize(static_cast<size_t>(n));
  o.got_id.resize(static_cast<size_t>(n));
  const auto t0 = clk::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        nccl::TcpExchange x("127.0.0.1", port, timeout, secrets[static_cast<size_t>(r)]);
        const nccl::UniqueId id = x.exchange(r, n, [] { return test_id('k'); });
        o.got_id[static_cast<size_t>(r)] = std::memcmp(id.internal, test_id('k').internal, nccl::kUniqueIdBytes) == 0;
      } catch (const std::exception& e) {
        o.errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  o.seconds = std::chrono::duration<double>(clk::now() - t0).count();
  return o;
}

bool has_id_bytes(const std::string& got) { return got.find(std::string(16, 'k')) != std::string::npos; }

}  // namespace

TEST(IdExchange, StrangersDoNotDelayOrBreakTheExchange) {
  const int port = free_port();
  std::string err0;
  bool ok0 = false;
  std::thread r0([&] {
    try {
      nccl::TcpExchange x("127.0.0.1", port, std::chrono::seconds(20), kSecret);
      ok0 = std::memcmp(x.exchange(0, 2, [] { return test_id('k'); }).internal, test_id('k').internal,
                        nccl::kUniqueIdBytes) == 0;
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  // Three strangers before rank 1: one holds its connection open saying nothing, one sends garbage, one sends a
  // well-formed hello with a forged proof. None may take rank 1's place, delay it, or see the id.
  const int silent = connect_raw(port);
  ASSERT_GE(silent, 0);
  const int g = connect_raw(port);
  ::send(g, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL);
  const std::string garbage_got = drain(g, 2000);
  ::close(g);
  const int f = connect_raw(port);
  std::string hello = "TRIDNCH2";
  hello += std::string("\x01\x00\x00\x00\x02\x00\x00\x00", 8);
  hello += std::string(32, 'm');
  const std::string challenge = drain(f, 100);
  ::send(f, hello.data(), hello.size(), MSG_NOSIGNAL);
  const std::string forged_got = drain(f, 2000);
  ::close(f);
  // rank 1 now, with the silent stranger still connected
  const auto t1 = clk::now();
  std::string err1;
  bool ok1 = false;
  try {
    nccl::TcpExchange x("127.0.0.1", port, std::chrono::seconds(20), kSecret);
    ok1 = std::memcmp(x.exchange(1, 2, [] { return test_id('x'); }).internal, test_id('k').internal,
                      nccl::kUniqueIdBytes) == 0;
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  const double rank1_s = std::chrono::duration<double>(clk::now() - t1).count();
  r0.join();
  ::close(silent);
  EXPECT_EQ(err0, "");
  EXPECT_EQ(err1, "");
  EXPECT_TRUE(ok0 && ok1);
  EXPECT_LT(rank1_s, 1.0) << "a stranger holding a connection open delayed the exchange";
  EXPECT_EQ(challenge.substr(0, 8), "TRIDNCC2");
  EXPECT_EQ(garbage_got.substr(0, 8), "TRIDNCC2");
  EXPECT_EQ(garbage_got.size(), 40u) << "a stranger that sent garbage got more than the challenge";
  EXPECT_FALSE(has_id_bytes(garbage_got));
  EXPECT_FALSE(has_id_bytes(forged_got)) << "the id went to a forged hello";
  EXPECT_EQ(forged_got.substr(0, 8), "TRIDNCX2") << "a forged hello is refused with a reason";
}

TEST(IdExchange, AWrongSecretIsRefusedWithOneError) {
  const int port = free_port();
  const Outcome o = run_ranks(port, 2, {kSecret, "fedcba9876543210fedcba9876543210"}, std::chrono::milliseconds(1500));
  EXPECT_NE(o.errors[1].find("refused rank 1: wrong secret: TRIDENT_JOB_SECRET differs from rank 0's"),
            std::string::npos)
      << o.errors[1];
  EXPECT_FALSE(o.got_id[1]);
  EXPECT_NE(o.errors[0].find("0 of the other 1 rank received the id; 1 connection refused"), std::string::npos) << o.errors[0];
}

TEST(IdExchange, EachRankIsServedOnce) {
  const int port = free_port();
  // ranks 0, 1, 1: one of the two rank-1 processes gets the id, the other is refused
  std::vector<std::string> errs(2);
  std::thread r0([&] {
    try {
      nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(10), kSecret).exchange(0, 3, [] { return test_id('k'); });
    } catch (const std::exception& e) {
      errs[0] = e.what();
    }
  });
  auto one = [&] {
    try {
      nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(10), kSecret).exchange(1, 3, [] { return test_id('x'); });
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  const std::string a = one(), b = one();
  EXPECT_EQ(a, "");
  EXPECT_NE(b.find("already received the id"), std::string::npos) << b;
  std::thread r2([&] {
    try {
      nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(10), kSecret).exchange(2, 3, [] { return test_id('x'); });
    } catch (const std::exception& e) {
      errs[1] = e.what();
    }
  });
  r0.join();
  r2.join();
  EXPECT_EQ(errs[0], "");
  EXPECT_EQ(errs[1], "");
}

TEST(IdExchange, AForgedReplyFailsAuthentication) {
  // A process squatting on the port answers with a challenge and an id without knowing the secret.
  const int port = free_port();
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ASSERT_EQ(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(ls, 4), 0);
  std::thread squatter([&] {
    const int c = ::accept(ls, nullptr, nullptr);
    std::string m = "TRIDNCC2" + std::string(32, 'n');
    ::send(c, m.data(), m.size(), MSG_NOSIGNAL);
    char hello[48];
    ::recv(c, hello, sizeof hello, MSG_WAITALL);
    std::string reply = "TRIDNCI2" + std::string(128, 'e') + std::string(32, 'f');
    ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
    drain(c, 500);
    ::close(c);
  });
  std::string err;
  try {
    nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(5), kSecret).exchange(1, 2, [] { return test_id('x'); });
  } catch (const Error& e) {
    err = e.what();
  }
  squatter.join();
  ::close(ls);
  EXPECT_NE(err.find("failed authentication"), std::string::npos) << err;
}

TEST(IdExchange, ASecretIsRequiredOffLoopback) {
  for (int rank : {0, 1}) {
    std::string err;
    try {
      nccl::TcpExchange("10.255.255.1", 29999, std::chrono::milliseconds(200), "").exchange(rank, 2, [] {
        return test_id('x');
      });
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("is not a loopback address and TRIDENT_JOB_SECRET is not set"), std::string::npos) << err;
  }
  std::string err;
  try {
    nccl::TcpExchange("127.0.0.1", free_port(), std::chrono::milliseconds(200), "short").exchange(0, 1, [] {
      return test_id('x');
    });
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("TRIDENT_JOB_SECRET has 5 characters; use at least 16"), std::string::npos) << err;
  // Without a secret on loopback, the exchange works (the MAC still binds the reply to the challenge).
  const Outcome o = run_ranks(free_port(), 3, {"", "", ""}, std::chrono::seconds(10));
  for (const std::string& e : o.errors) EXPECT_EQ(e, "");
}

TEST(IdExchange, EnvironmentPicksPortAndSecret) {
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "65535", 1);
  ::unsetenv("TRIDENT_NCCL_ID_PORT");
  EXPECT_THROW(nccl::exchange_from_env(), Error);  // no room for MASTER_PORT + 1
  ::setenv("TRIDENT_NCCL_ID_PORT", "0", 1);
  EXPECT_THROW(nccl::exchange_from_env(), Error);
  // A full exchange through the environment: MASTER_PORT + 1 and TRIDENT_JOB_SECRET
  const int port = free_port();
  ::setenv("MASTER_PORT", std::to_string(port - 1).c_str(), 1);
  ::unsetenv("TRIDENT_NCCL_ID_PORT");
  ::setenv("TRIDENT_JOB_SECRET", kSecret.c_str(), 1);
  std::vector<std::string> errs(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        nccl::exchange_from_env(std::chrono::seconds(10))->exchange(r, 2, [] { return test_id('k'); });
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(errs[0], "");
  EXPECT_EQ(errs[1], "");
  EXPECT_EQ(nccl::make_job_secret().size(), 64u);
  EXPECT_NE(nccl::make_job_secret(), nccl::make_job_secret());
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "TRIDENT_JOB_SECRET"}) ::unsetenv(v);
}

TEST(IdExchange, TheIdFileNeverFollowsAPlantedLink) {
  namespace fs = std::filesystem;
  std::string t = (fs::temp_directory_path() / "trident-idfile-XXXXXX").string();
  const fs::path dir = ::mkdtemp(t.data());
  const fs::path victim = dir / "victim", id = dir / "nccl-id";
  { std::ofstream(victim) << "precious"; }
  fs::create_symlink(victim, id);
  for (int p = ::getpid() - 5; p < ::getpid() + 50; ++p)
    fs::create_symlink(victim, dir / ("nccl-id.tmp." + std::to_string(p)));
  // a reader refuses the link before rank 0 replaced it
  std::string err;
  try {
    nccl::FileExchange(id.string(), std::chrono::milliseconds(500)).exchange(1, 2, [] { return test_id('x'); });
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("is a symbolic link"), std::string::npos) << err;
  nccl::FileExchange(id.string(), std::chrono::seconds(5)).exchange(0, 2, [] { return test_id('k'); });
  EXPECT_FALSE(fs::is_symlink(id));
  EXPECT_EQ((fs::status(id).permissions() & fs::perms::all), fs::perms::owner_read | fs::perms::owner_write);
  std::ifstream v(victim);
  std::string content;
  v >> content;
  EXPECT_EQ(content, "precious");
  const nccl::UniqueId got =
      nccl::FileExchange(id.string(), std::chrono::seconds(5)).exchange(1, 2, [] { return test_id('x'); });
  EXPECT_EQ(std::memcmp(got.internal, test_id('k').internal, nccl::kUniqueIdBytes), 0);
  // a file others can write is refused
  fs::permissions(id, fs::perms::others_write, fs::perm_options::add);
  err.clear();
  try {
    nccl::FileExchange(id.string(), std::chrono::milliseconds(500)).exchange(1, 2, [] { return test_id('x'); });
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("writable by its owner only"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(IdExchange, RandomConnectionsNeverBreakTheExchange) {
  // 200 strangers with random bytes (a third of them starting with a valid hello's magic) during a 3-rank exchange;
  // seed 20261202. The ranks get the id; no stranger gets a byte of it.
  const int port = free_port();
  std::vector<std::string> errs(3);
  std::vector<std::thread> ranks;
  ranks.emplace_back([&] {
    try {
      nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(30), kSecret).exchange(0, 3, [] { return test_id('k'); });
    } catch (const std::exception& e) {
      errs[0] = e.what();
    }
  });
  auto start = [&](int r) {
    ranks.emplace_back([&, r] {
      try {
        nccl::TcpExchange("127.0.0.1", port, std::chrono::seconds(30), kSecret).exchange(r, 3, [] {
          return test_id('x');
        });
      } catch (const std::exception& e) {
        errs[static_cast<size_t>(r)] = e.what();
      }
    });
  };
  std::mt19937_64 rng(20261202);
  int leaked = 0;
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_raw(port);
    if (fd < 0) {
      ADD_FAILURE() << "stranger " << i << " could not connect; rank 0: " << errs[0];
      break;
    }
    std::string junk(rng() % 120, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (i % 3 == 0) junk = "TRIDNCH2" + junk;
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    if (i % 2 == 0) ::shutdown(fd, SHUT_WR);
    if (has_id_bytes(drain(fd, i % 10 == 0 ? 50 : 5))) ++leaked;
    ::close(fd);
    if (i == 100) start(1);  // rank 1 among the strangers; rank 2 after them (rank 0 then stops listening)
  }
  start(2);
  for (auto& t : ranks) t.join();
  for (const std::string& e : errs) EXPECT_EQ(e, "");
  EXPECT_EQ(leaked, 0);
  std::printf("repro: test_id_exchange --gtest_filter=IdExchange.RandomConnectionsNeverBreakTheExchange (seed "
              "20261202)\n");
}
