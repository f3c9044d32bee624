#include "gpu/nccl/nccl_bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "reference/check.h"

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
    const ssize_t k = write ? ::send(fd, buf + done, n - done, MSG_NOSIGNAL) : ::recv(fd, buf + done, n - done, 0);
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
    const std::string tmp = fmt::format("{}.tmp.{}", path_, ::getpid());
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
    TD_CHECK(f.fd >= 0, "NCCL id exchange (file): cannot create {}: {}", tmp, errno_str());
    char buf[kMsgBytes];
    std::memcpy(buf, kMagic, sizeof(kMagic));
    std::memcpy(buf + sizeof(kMagic), id.internal, kUniqueIdBytes);
    TD_CHECK(::write(f.fd, buf, kMsgBytes) == static_cast<ssize_t>(kMsgBytes) && ::fsync(f.fd) == 0,
             "NCCL id exchange (file): cannot write {}: {}", tmp, errno_str());
    TD_CHECK(::rename(tmp.c_str(), path_.c_str()) == 0, "NCCL id exchange (file): cannot rename {} to {}: {}", tmp,
             path_, errno_str());
    return id;
  }
  const auto until = clk::now() + timeout_;
  for (;;) {
    Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd >= 0) {
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

UniqueId TcpExchange::exchange(int rank, int nranks, const MakeId& make) {
  check_args(rank, nranks);
  TD_CHECK(port_ >= 1 && port_ <= 65535, "NCCL id exchange (tcp): port {} is out of range 1..65535", port_);
  const sockaddr_in sa = resolve(addr_, port_);
  const auto until = clk::now() + timeout_;
  char msg[kMsgBytes];
  if (rank == 0) {
    Fd ls{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    TD_CHECK(ls.fd >= 0, "NCCL id exchange (tcp): socket: {}", errno_str());
    const int one = 1;
    ::setsockopt(ls.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    TD_CHECK(::bind(ls.fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0,
             "NCCL id exchange (tcp): rank 0 cannot listen on {}:{}: {}", addr_, port_, errno_str());
    TD_CHECK(::listen(ls.fd, 128) == 0, "NCCL id exchange (tcp): listen: {}", errno_str());
    const UniqueId id = make();
    std::memcpy(msg, kMagic, sizeof(kMagic));
    std::memcpy(msg + sizeof(kMagic), id.internal, kUniqueIdBytes);
    for (int served = 0; served < nranks - 1;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now()).count();
      if (left <= 0)
        fail(fmt::format("NCCL id exchange (tcp): rank 0 waited {} ms on {}:{}; {} of {} ranks connected",
                         timeout_.count(), addr_, port_, served, nranks - 1));
      pollfd p{ls.fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
      Fd c{::accept4(ls.fd, nullptr, nullptr, SOCK_CLOEXEC)};
      if (c.fd < 0) continue;
      if (io_all(c.fd, msg, kMsgBytes, true, until)) ++served;
    }
    return id;
  }
  for (;;) {
    Fd c{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    TD_CHECK(c.fd >= 0, "NCCL id exchange (tcp): socket: {}", errno_str());
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0) {
      TD_CHECK(io_all(c.fd, msg, kMsgBytes, false, until) && std::memcmp(msg, kMagic, sizeof(kMagic)) == 0,
               "NCCL id exchange (tcp): rank {} connected to {}:{} but did not receive a unique id", rank, addr_,
               port_);
      UniqueId id;
      std::memcpy(id.internal, msg + sizeof(kMagic), kUniqueIdBytes);
      return id;
    }
    if (clk::now() >= until)
      fail(fmt::format("NCCL id exchange (tcp): rank {} could not reach rank 0 at {}:{} within {} ms ({})", rank,
                       addr_, port_, timeout_.count(), errno_str()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::unique_ptr<IdExchange> exchange_from_env(std::chrono::milliseconds timeout) {
  if (const char* f = std::getenv("TRIDENT_NCCL_ID_FILE"); f && *f) return std::make_unique<FileExchange>(f, timeout);
  const char* a = std::getenv("MASTER_ADDR");
  const char* p = std::getenv("MASTER_PORT");
  if (a && *a && p && *p) {
    char* end = nullptr;
    errno = 0;
    const long port = std::strtol(p, &end, 10);
    TD_CHECK(errno == 0 && end && *end == '\0' && port >= 1 && port <= 65535,
             "MASTER_PORT must be a port number 1..65535, got '{}'", p);
    return std::make_unique<TcpExchange>(a, static_cast<int>(port), timeout);
  }
  return nullptr;
}

}  // namespace trident::nccl
