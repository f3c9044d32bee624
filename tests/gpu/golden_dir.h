// The checked-in goldens' folder for the GPU tests, found at run time so that no build-machine path is baked into
// a binary that travels (scripts/device-check --stage): $TRIDENT_GOLDEN_DATA when set, else the first golden/data
// (holding primitives/) found walking up from the executable's folder (the source tree from
// build/<preset>/tests/gpu, a staged bundle from <bundle>/tests/gpu), else golden/data under the working folder.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include "platform/process.h"

namespace trident::gputest {

inline std::string golden_data_dir() {
  namespace fs = std::filesystem;
  if (const char* e = std::getenv("TRIDENT_GOLDEN_DATA"); e && *e) return e;
  std::error_code ec;
  fs::path dir = fs::path(platform::executable_path()).parent_path();
  for (int up = 0; !ec && up < 8 && !dir.empty(); ++up) {
    if (fs::is_directory(dir / "golden" / "data" / "primitives", ec)) return (dir / "golden" / "data").string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return "golden/data";
}

}  // namespace trident::gputest
