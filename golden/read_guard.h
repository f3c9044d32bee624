// The protections every HDF5 reader of Trident shares (state dumps, primitive goldens, checkpoint rank files;
// docs/golden.md "What the reader checks"): the checksum header, the walk of HDF5's global heaps before HDF5 parses
// them, and the parse in a forked child process with a time limit. Internal to golden/.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "golden/state_dump.h"

namespace trident::golden {

// verify_checksum with `kind` ("state dump", "primitive golden") in its error lines.
Checksum verify_checksum_of(const std::string& path, const char* kind);

// Walks every HDF5 global heap collection (GCOL) of the file the way HDF5 1.10 will and refuses one HDF5 would
// crash or loop on (an object that does not fit, an empty free-space object). `superblock`: where the HDF5 data
// starts (0, or kChecksumBlock after the checksum header). Throws trident::Error naming `kind` and the byte.
void check_global_heaps(const std::string& path, uint64_t file_size, uint64_t superblock, const char* kind);

// Runs `work` in a forked child process (it dies with its parent) with a time limit of `limit_s` seconds (0: 10 s
// plus 1 s per 50 MB of `file_size`); `result` gets the string `work` returned. A trident::Error thrown by `work` is
// rethrown here with its message; a crash (signal), a child that ends without a result, or the time limit is one
// trident::Error naming `kind` and `path`. Returns false (nothing done) when no child could be forked.
bool run_isolated(const std::string& path, uint64_t file_size, const char* kind,
                  const std::function<std::string()>& work, std::string& result, double limit_s = 0);

}  // namespace trident::golden
