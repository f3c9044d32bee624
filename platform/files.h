// File-system calls that differ between systems.
//
// rename_exchange(): Linux renameat2(RENAME_EXCHANGE), macOS renamex_np(RENAME_SWAP): the two paths swap atomically;
// with TRIDENT_PORTABLE on Linux it reports ENOSYS, so the callers' two-rename fallback runs in that build.
#pragma once

namespace trident::platform {

// Swaps the names `a` and `b` atomically. 0 on success; -1 with errno set otherwise (EINVAL, ENOSYS or EOPNOTSUPP
// where the file system or the system has no atomic exchange: the caller falls back to two renames).
int rename_exchange(const char* a, const char* b);

}  // namespace trident::platform
