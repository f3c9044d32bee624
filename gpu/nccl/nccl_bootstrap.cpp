#include "gpu/nccl/nccl_bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "platform/net.h"
#include "reference/atomic_write.h"
#include "reference/check.h"
#include "reference/counted.h"

namespace trident::nccl {
namespace {

// The wire/file format: a magic word, then the id.
constexpr char kMagic[8] = {'T', 'R', 'I', 'D', 'N', 'C', 'I', '1'};
constexpr size_t kMsgBytes = sizeof(kMagic) + kUniqueIdBytes;

using clk = std::chrono::steady_clock;

void check_args(int rank, int nranks) {
  TD_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, "NCCL id exchange: rank {} of {} ranks is out of range", rank,
           nranks);
}

std::string errno_str() { return std::strerror(errno); }

// Reads or writes exactly n bytes on a socket before the deadline.
bool io_all(int fd, char* buf, size_t n, bool write, clk::time_point until) {
  size_t done = 0;
  while (done < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int pr = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    const ssize_t k = write ? platform::send_nosignal(fd, buf + done, n - done) : ::recv(fd, buf + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    done += static_cast<size_t>(k);
  }
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

sockaddr_in resolve(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &res);
  TD_CHECK(rc == 0 && res, "NCCL id exchange: cannot resolve MASTER_ADDR '{}': {}", addr, gai_strerror(rc));
  sockaddr_in sa = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

}  // namespace

UniqueId InProcessExchange::exchange(int rank, int nranks, const MakeId& make) {
  check_args(rank, nranks);
  std::unique_lock lk(mu_);
  if (rank == 0) {
    try {
      id_ = make();
    } catch (const std::exception& e) {
      error_ = e.what();
      cv_.notify_all();
      throw;
    }
    cv_.notify_all();
    return *id_;
  }
  if (!cv_.wait_for(lk, timeout_, [&] { return id_.has_value() || !error_.empty(); }))
    fail(fmt::format("NCCL id exchange (in-process): rank {} waited {} ms for rank 0's unique id", rank,
                     timeout_.count()));
  if (!id_) fail("NCCL id exchange (in-process): rank 0 failed to make the unique id: " + error_);
  return *id_;
}

UniqueId FileExchange::exchange(int rank, int nranks, const MakeId& make) {
  check_args(rank, nranks);
  TD_CHECK(!path_.empty(), "NCCL id exchange (file): empty path");
  if (rank == 0) {
    const UniqueId id = make();
    // Staged in a private folder and renamed onto the path (reference/atomic_write.h): a link planted next to it
    // is never followed. Mode 0600: the id lets a process join the communicator.
    io::StagedFile out(path_, "NCCL id file");
    {
      Fd f{io::open_exclusive(out.path(), O_WRONLY, 0600)};
      TD_CHECK(f.fd >= 0, "NCCL id exchange (file): cannot create {}: {}", out.path(), errno_str());
      char buf[kMsgBytes];
      std::memcpy(buf, kMagic, sizeof(kMagic));
      std::memcpy(buf + sizeof(kMagic), id.internal, kUniqueIdBytes);
      TD_CHECK(::write(f.fd, buf, kMsgBytes) == static_cast<ssize_t>(kMsgBytes),
               "NCCL id exchange (file): cannot write {}: {}", out.path(), errno_str());
    }
    out.commit();
    return id;
  }
  const auto until = clk::now() + timeout_;
  for (;;) {
    Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)};
    if (f.fd < 0 && errno == ELOOP)
      fail(fmt::format("NCCL id exchange (file): {} is a symbolic link; rank 0 writes a regular file there", path_));
    if (f.fd >= 0) {
      // Only a file rank 0 of this user could have written: a regular file of ours that nobody else can write.
      struct stat st {};
      TD_CHECK(::fstat(f.fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                   (st.st_mode & (S_IWGRP | S_IWOTH)) == 0,
               "NCCL id exchange (file): {} is not a regular file of this user writable by its owner only (refusing "
               "an id someone else could have planted)",
               path_);
      char buf[kMsgBytes + 1];
      const ssize_t k = ::read(f.fd, buf, sizeof(buf));
      TD_CHECK(k == static_cast<ssize_t>(kMsgBytes) && std::memcmp(buf, kMagic, sizeof(kMagic)) == 0,
               "NCCL id exchange (file): {} is not a unique-id file written by rank 0 ({} bytes)", path_, k);
      UniqueId id;
      std::memcpy(id.internal, buf + sizeof(kMagic), kUniqueIdBytes);
      return id;
    }
    if (clk::now() >= until)
      fail(fmt::format("NCCL id exchange (file): rank {} waited {} ms for rank 0 to write {}", rank,
                       timeout_.count(), path_));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// ---- TCP: the authenticated handshake (nccl_bootstrap.h, docs/security.md section 2) ---------------------------
namespace {

constexpr char kChallenge[8] = {'T', 'R', 'I', 'D', 'N', 'C', 'C', '2'};
constexpr char kHello[8] = {'T', 'R', 'I', 'D', 'N', 'C', 'H', '2'};
constexpr char kReplyId[8] = {'T', 'R', 'I', 'D', 'N', 'C', 'I', '2'};
constexpr char kReplyNo[8] = {'T', 'R', 'I', 'D', 'N', 'C', 'X', '2'};
constexpr size_t kNonce = 32, kMac = 32;
constexpr size_t kChallengeBytes = 8 + kNonce;        // 40
constexpr size_t kHelloBytes = 8 + 4 + 4 + kMac;      // 48
constexpr size_t kReplyIdBytes = 8 + kUniqueIdBytes + kMac;  // 168
constexpr size_t kReplyNoBytes = 8 + 4;               // 12
constexpr auto kHandshake = std::chrono::seconds(5);  // one connection's time to say who it is
constexpr size_t kMaxPending = 64;                    // connections in handshake at once

enum Refusal : uint32_t { kWrongSecret = 1, kServed = 2, kWorldSize = 3, kRankRange = 4 };

const char* refusal_text(uint32_t r) {
  switch (r) {
    case kWrongSecret: return "wrong secret: TRIDENT_JOB_SECRET differs from rank 0's";
    case kServed: return "this rank already received the id (two processes with the same RANK?)";
    case kWorldSize: return "WORLD_SIZE differs from rank 0's";
    case kRankRange: return "RANK is outside 1..WORLD_SIZE-1";
    default: return "unknown reason";
  }
}

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

using Mac = std::array<unsigned char, kMac>;

Mac hmac(const std::string& key, const std::string& label, const char* nonce, const std::vector<char>& rest) {
  std::vector<unsigned char> msg(label.begin(), label.end());
  msg.insert(msg.end(), reinterpret_cast<const unsigned char*>(nonce),
             reinterpret_cast<const unsigned char*>(nonce) + kNonce);
  msg.insert(msg.end(), rest.begin(), rest.end());
  Mac out{};
  unsigned len = 0;
  // An empty key is allowed by HMAC (loopback without a secret); OpenSSL wants a non-null pointer.
  static const char zero = 0;
  TD_CHECK(HMAC(EVP_sha256(), key.empty() ? &zero : key.data(), static_cast<int>(key.size()), msg.data(),
                msg.size(), out.data(), &len) != nullptr &&
               len == kMac,
           "NCCL id exchange (tcp): HMAC-SHA256 failed");
  return out;
}

std::vector<char> u32s(uint32_t a, uint32_t b) {
  std::vector<char> v(8);
  put_u32(v.data(), a), put_u32(v.data() + 4, b);
  return v;
}

Mac hello_mac(const std::string& key, const char* nonce, uint32_t rank, uint32_t nranks) {
  return hmac(key, "hello", nonce, u32s(rank, nranks));
}
Mac id_mac(const std::string& key, const char* nonce, uint32_t rank, const UniqueId& id) {
  std::vector<char> rest(4);
  put_u32(rest.data(), rank);
  rest.insert(rest.end(), id.internal, id.internal + kUniqueIdBytes);
  return hmac(key, "id", nonce, rest);
}

bool loopback(const sockaddr_in& sa) { return (ntohl(sa.sin_addr.s_addr) >> 24) == 127; }

void check_secret(const std::string& secret, const sockaddr_in& sa, const std::string& addr) {
  if (secret.empty())
    TD_CHECK(loopback(sa),
             "NCCL id exchange (tcp): MASTER_ADDR {} is not a loopback address and TRIDENT_JOB_SECRET is not set: "
             "set it to the same random value on every rank (for example `export TRIDENT_JOB_SECRET=$(openssl "
             "rand -hex 32)`), or start the job with `trident launch`, which makes one",
             addr);
  else
    TD_CHECK(secret.size() >= 16, "NCCL id exchange (tcp): TRIDENT_JOB_SECRET has {} characters; use at least 16 "
             "(for example `openssl rand -hex 32`)", secret.size());
}

// One connection in rank 0's handshake.
struct Conn {
  int fd = -1;
  clk::time_point deadline;
  char nonce[kNonce];
  char in[kHelloBytes];
  size_t got = 0;
  std::string out;  // bytes still to send
  size_t sent = 0;
  int rank = -1;    // the rank this reply serves, once verified
  bool close_after_send = false;
};

// Rank 0: serves the id to nranks - 1 authenticated ranks, concurrently, until the deadline.
void serve(int lfd, int nranks, const UniqueId& id, const std::string& secret, clk::time_point until,
           const std::string& where, std::chrono::milliseconds timeout) {
  std::vector<Conn> conns;
  std::set<int> served;  // ranks whose reply was fully sent
  std::set<int> serving;  // ranks with a verified reply in flight
  int refused = 0, strangers = 0;
  auto close_conn = [&](size_t i) {
    ::close(conns[i].fd);
    if (conns[i].rank >= 0 && !served.count(conns[i].rank)) serving.erase(conns[i].rank);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (static_cast<int>(served.size()) < nranks - 1) {
    const auto now = clk::now();
    if (now >= until) {
      for (size_t i = conns.size(); i-- > 0;) close_conn(i);
      fail(fmt::format("NCCL id exchange (tcp): rank 0 waited {} ms on {}; {} of the other {} received the id{}{}",
                       timeout.count(), where, served.size(), counted(nranks - 1, "rank"),
                       refused ? fmt::format("; {} refused (wrong secret, rank or WORLD_SIZE)",
                                             counted(refused, "connection"))
                               : "",
                       strangers ? fmt::format("; {} closed that were not Trident ranks",
                                               counted(strangers, "connection"))
                                 : ""));
    }
    std::vector<pollfd> p;
    p.push_back(pollfd{lfd, POLLIN, 0});
    for (const Conn& c : conns)
      p.push_back(pollfd{c.fd, static_cast<short>(c.sent < c.out.size() ? POLLOUT : POLLIN), 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    const int pr = ::poll(p.data(), p.size(), static_cast<int>(std::clamp<int64_t>(left, 1, 200)));
    if (pr < 0 && errno != EINTR) fail(fmt::format("NCCL id exchange (tcp): poll: {}", errno_str()));
    // New connections: a challenge each (a full table drops the oldest handshake, never a verified reply).
    if (pr > 0 && (p[0].revents & POLLIN)) {
      for (;;) {
        const int fd = platform::accept_cloexec(lfd, /*nonblock=*/true);
        if (fd < 0) break;
        if (conns.size() >= kMaxPending) {
          for (size_t i = 0; i < conns.size(); ++i)
            if (conns[i].rank < 0) {
              ++strangers;
              close_conn(i);
              break;
            }
          if (conns.size() >= kMaxPending) {
            ::close(fd);
            continue;
          }
        }
        Conn c;
        c.fd = fd;
        c.deadline = std::min(until, clk::now() + kHandshake);
        TD_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(c.nonce), kNonce) == 1,
                 "NCCL id exchange (tcp): no random bytes for a challenge");
        c.out.assign(kChallenge, sizeof(kChallenge));
        c.out.append(c.nonce, kNonce);
        conns.push_back(std::move(c));
      }
    }
    // Progress on every connection (indices shift as connections close: walk backwards).
    for (size_t i = conns.size(); i-- > 0;) {
      Conn& c = conns[i];
      if (c.sent < c.out.size()) {
        const ssize_t k = platform::send_nosignal(c.fd, c.out.data() + c.sent, c.out.size() - c.sent);
        if (k > 0) c.sent += static_cast<size_t>(k);
        else if (k < 0 && errno != EAGAIN && errno != EINTR) {
          close_conn(i);
          continue;
        }
        if (c.sent == c.out.size()) {
          if (c.rank >= 0) {
            served.insert(c.rank);
            close_conn(i);
            continue;
          }
          if (c.close_after_send) {
            close_conn(i);
            continue;
          }
        }
      } else if (c.got < kHelloBytes) {
        const ssize_t k = ::recv(c.fd, c.in + c.got, kHelloBytes - c.got, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
          ++strangers;
          close_conn(i);
          continue;
        }
        if (k > 0) c.got += static_cast<size_t>(k);
        if (c.got >= sizeof(kHello) && std::memcmp(c.in, kHello, sizeof(kHello)) != 0) {
          ++strangers;  // not a Trident rank: closed without a byte of the id
          close_conn(i);
          continue;
        }
        if (c.got == kHelloBytes) {
          const uint32_t r = get_u32(c.in + 8), n = get_u32(c.in + 12);
          const Mac want = hello_mac(secret, c.nonce, r, n);
          uint32_t no = 0;
          if (CRYPTO_memcmp(want.data(), c.in + 16, kMac) != 0) no = kWrongSecret;
          else if (n != static_cast<uint32_t>(nranks)) no = kWorldSize;
          else if (r < 1 || r >= n) no = kRankRange;
          else if (served.count(static_cast<int>(r)) || serving.count(static_cast<int>(r))) no = kServed;
          c.out.clear(), c.sent = 0;
          if (no) {
            ++refused;
            char b[kReplyNoBytes];
            std::memcpy(b, kReplyNo, 8);
            put_u32(b + 8, no);
            c.out.assign(b, sizeof b);
            c.close_after_send = true;
          } else {
            const Mac m = id_mac(secret, c.nonce, r, id);
            c.out.assign(kReplyId, 8);
            c.out.append(id.internal, kUniqueIdBytes);
            c.out.append(reinterpret_cast<const char*>(m.data()), kMac);
            c.rank = static_cast<int>(r);
            serving.insert(c.rank);
          }
          c.deadline = std::min(until, clk::now() + kHandshake);
        }
      }
      if (clk::now() >= c.deadline) {
        if (c.rank < 0 && !c.close_after_send) ++strangers;
        close_conn(i);
      }
    }
  }
  for (size_t i = conns.size(); i-- > 0;) close_conn(i);
}

}  // namespace

std::string make_job_secret() {
  unsigned char b[32];
  TD_CHECK(RAND_bytes(b, sizeof b) == 1, "cannot make a job secret: no random bytes");
  std::string s;
  for (unsigned char c : b) s += fmt::format("{:02x}", c);
  return s;
}

UniqueId TcpExchange::exchange(int rank, int nranks, const MakeId& make) {
  check_args(rank, nranks);
  TD_CHECK(port_ >= 1 && port_ <= 65535, "NCCL id exchange (tcp): port {} is out of range 1..65535", port_);
  const sockaddr_in sa = resolve(addr_, port_);
  check_secret(secret_, sa, addr_);
  const std::string where = fmt::format("{}:{}", addr_, port_);
  const auto until = clk::now() + timeout_;
  if (rank == 0) {
    Fd ls{platform::socket_cloexec(AF_INET, SOCK_STREAM, /*nonblock=*/true)};
    TD_CHECK(ls.fd >= 0, "NCCL id exchange (tcp): socket: {}", errno_str());
    const int one = 1;
    ::setsockopt(ls.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    TD_CHECK(::bind(ls.fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0,
             "NCCL id exchange (tcp): rank 0 cannot listen on {}: {} (TRIDENT_NCCL_ID_PORT picks another port)",
             where, errno_str());
    TD_CHECK(::listen(ls.fd, 128) == 0, "NCCL id exchange (tcp): listen: {}", errno_str());
    const UniqueId id = make();
    serve(ls.fd, nranks, id, secret_, until, where, timeout_);
    return id;
  }
  for (;;) {
    Fd c{platform::socket_cloexec(AF_INET, SOCK_STREAM, /*nonblock=*/false)};
    TD_CHECK(c.fd >= 0, "NCCL id exchange (tcp): socket: {}", errno_str());
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) {
      const auto hs = std::min(until, clk::now() + kHandshake);
      char ch[kChallengeBytes];
      if (!io_all(c.fd, ch, kChallengeBytes, false, hs)) {
        // Closed before the challenge (rank 0's table was full, or it is restarting): try again until the deadline.
        if (clk::now() >= until)
          fail(fmt::format("NCCL id exchange (tcp): rank {} got no challenge from {} within {} ms", rank, where,
                           timeout_.count()));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      TD_CHECK(std::memcmp(ch, kChallenge, sizeof(kChallenge)) == 0,
               "NCCL id exchange (tcp): {} is not Trident's id exchange (is TRIDENT_NCCL_ID_PORT, or MASTER_PORT + 1, "
               "the port rank 0 listens on?)",
               where);
      const char* nonce = ch + 8;
      char hello[kHelloBytes];
      std::memcpy(hello, kHello, 8);
      put_u32(hello + 8, static_cast<uint32_t>(rank));
      put_u32(hello + 12, static_cast<uint32_t>(nranks));
      const Mac hm = hello_mac(secret_, nonce, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks));
      std::memcpy(hello + 16, hm.data(), kMac);
      char head[8];
      TD_CHECK(io_all(c.fd, hello, kHelloBytes, true, hs) && io_all(c.fd, head, 8, false, hs),
               "NCCL id exchange (tcp): rank {}: {} closed the connection during the handshake", rank, where);
      if (std::memcmp(head, kReplyNo, 8) == 0) {
        char why[4];
        const bool ok = io_all(c.fd, why, 4, false, hs);
        fail(fmt::format("NCCL id exchange (tcp): rank 0 at {} refused rank {}: {}", where, rank,
                         ok ? refusal_text(get_u32(why)) : "no reason given"));
      }
      char body[kUniqueIdBytes + kMac];
      TD_CHECK(std::memcmp(head, kReplyId, 8) == 0 && io_all(c.fd, body, sizeof body, false, hs),
               "NCCL id exchange (tcp): rank {}: {} sent no unique id", rank, where);
      UniqueId id;
      std::memcpy(id.internal, body, kUniqueIdBytes);
      const Mac want = id_mac(secret_, nonce, static_cast<uint32_t>(rank), id);
      TD_CHECK(CRYPTO_memcmp(want.data(), body + kUniqueIdBytes, kMac) == 0,
               "NCCL id exchange (tcp): rank {}: the reply from {} failed authentication (another process on that "
               "port, or a different TRIDENT_JOB_SECRET)",
               rank, where);
      return id;
    }
    if (clk::now() >= until)
      fail(fmt::format("NCCL id exchange (tcp): rank {} could not reach rank 0 at {} within {} ms ({})", rank, where,
                       timeout_.count(), errno_str()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::unique_ptr<IdExchange> exchange_from_env(std::chrono::milliseconds timeout) {
  if (const char* f = std::getenv("TRIDENT_NCCL_ID_FILE"); f && *f) return std::make_unique<FileExchange>(f, timeout);
  const char* a = std::getenv("MASTER_ADDR");
  const char* p = std::getenv("MASTER_PORT");
  if (a && *a && p && *p) {
    auto port_of = [](const char* name, const char* v) {
      char* end = nullptr;
      errno = 0;
      const long port = std::strtol(v, &end, 10);
      TD_CHECK(errno == 0 && end && end != v && *end == '\0' && port >= 1 && port <= 65535,
               "{} must be a port number 1..65535, got '{}'", name, v);
      return static_cast<int>(port);
    };
    const int master = port_of("MASTER_PORT", p);
    int port = master + 1;  // torchrun's store holds MASTER_PORT itself
    if (const char* ip = std::getenv("TRIDENT_NCCL_ID_PORT"); ip && *ip) port = port_of("TRIDENT_NCCL_ID_PORT", ip);
    TD_CHECK(port <= 65535, "MASTER_PORT {} leaves no port for the NCCL id exchange (MASTER_PORT + 1); set "
             "TRIDENT_NCCL_ID_PORT", master);
    const char* sec = std::getenv("TRIDENT_JOB_SECRET");
    return std::make_unique<TcpExchange>(a, port, timeout, sec ? std::string(sec) : std::string());
  }
  return nullptr;
}

}  // namespace trident::nccl
