// "1 rank", "4 ranks": a count with its noun in the right number, for every message and report line.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace trident {

// counted(1, "step") -> "1 step"; counted(3, "step") -> "3 steps"; counted(2, "process", "processes").
inline std::string counted(int64_t n, std::string_view one, std::string_view many = {}) {
  if (n == 1) return fmt::format("1 {}", one);
  return many.empty() ? fmt::format("{} {}s", n, one) : fmt::format("{} {}", n, many);
}

}  // namespace trident
