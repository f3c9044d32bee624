// platform/files.h.
#include "platform/files.h"

#include <cerrno>
#include <cstdio>

#include <fcntl.h>
#include <stdio.h>  // renameat2 and RENAME_EXCHANGE (glibc), renamex_np and RENAME_SWAP (macOS)

namespace trident::platform {

int rename_exchange(const char* a, const char* b) {
#if defined(__linux__) && defined(RENAME_EXCHANGE) && !defined(TRIDENT_PORTABLE)
  return ::renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
#elif defined(__APPLE__)
  return ::renamex_np(a, b, RENAME_SWAP);
#else
  (void)a, (void)b;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace trident::platform
