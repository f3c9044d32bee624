// platform/net.h.
#include "platform/net.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace trident::platform {

#if !defined(__linux__) || defined(TRIDENT_PORTABLE)
namespace {
// The flags Linux sets in one call: close-on-exec, non-blocking, no SIGPIPE (where the system has SO_NOSIGPIPE).
int set_flags(int fd, bool nonblock) {
  if (fd < 0) return fd;
  bool ok = ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0;
  if (ok && nonblock) ok = ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) == 0;
#if defined(SO_NOSIGPIPE)
  const int one = 1;
  if (ok) ok = ::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one)) == 0;
#endif
  if (ok) return fd;
  const int e = errno;
  ::close(fd);
  errno = e;
  return -1;
}
}  // namespace
#endif

int socket_cloexec(int domain, int type, bool nonblock) {
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  return ::socket(domain, type | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
#else
  return set_flags(::socket(domain, type, 0), nonblock);
#endif
}

int accept_cloexec(int lfd, bool nonblock) {
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  return ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0));
#else
  return set_flags(::accept(lfd, nullptr, nullptr), nonblock);
#endif
}

ssize_t send_nosignal(int fd, const void* buf, size_t n) {
#if defined(MSG_NOSIGNAL)
  return ::send(fd, buf, n, MSG_NOSIGNAL);
#else
  return ::send(fd, buf, n, 0);  // the socket carries SO_NOSIGPIPE (set_flags)
#endif
}

}  // namespace trident::platform
