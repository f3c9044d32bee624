// Socket calls that differ between systems: close-on-exec and non-blocking flags, and no SIGPIPE on a closed peer.
//
// Linux: SOCK_CLOEXEC / SOCK_NONBLOCK, accept4 and send(MSG_NOSIGNAL). Elsewhere and with TRIDENT_PORTABLE: socket /
// accept, then fcntl for the flags, SO_NOSIGPIPE on the socket where the system has it (macOS), and
// send(MSG_NOSIGNAL) where the system has that flag.
#pragma once
#include <sys/types.h>

#include <cstddef>

namespace trident::platform {

// socket(domain, type, 0), close-on-exec, non-blocking when asked. -1 with errno on failure.
int socket_cloexec(int domain, int type, bool nonblock);
// accept(lfd) with the new socket close-on-exec, non-blocking when asked. -1 with errno (EAGAIN: none pending).
int accept_cloexec(int lfd, bool nonblock);
// send() that never raises SIGPIPE (EPIPE instead).
ssize_t send_nosignal(int fd, const void* buf, size_t n);

}  // namespace trident::platform
