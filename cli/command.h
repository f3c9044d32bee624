// The `trident` front door: one binary, one subcommand per cli/cmd_*.cpp file.
// Each file registers itself with TRIDENT_COMMAND; main() builds the CLI11 app from the registry.
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace trident::cli {

// setup() adds options to `sub` and returns the action to run once parsing succeeded.
// The action returns the process exit code; it may throw (main prints one line and exits 1).
using Action = std::function<int()>;
struct Command {
  std::string name;
  std::string help;
  std::function<Action(CLI::App& sub)> setup;
  // Exit code of a bad command line (and of an error thrown by the action): 1, or 2 where 1 means a finding
  // (`trident fuzz`: 1 when a property failed).
  int usage_exit = 1;
};

bool register_command(Command cmd);

// Peak resident set of this process (VmHWM from /proc/self/status), bytes; 0 where unavailable.
inline int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// The --preset option's help: "model preset: tiny, tiny-gqa, ..." from the preset list (reference/model/config.h).
std::string preset_help();

// Option check: an integer >= 1 ("must be a positive integer, got X").
inline CLI::Validator positive_int() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= 1) return {};
        } catch (const std::exception&) {
        }
        return "must be a positive integer, got " + v;
      },
      "INT>=1");
}

// Option check: an integer >= lo ("must be an integer >= LO, got X"), for flags where 0 (or 1) is not positive
// but still wrong or right, e.g. --steps 0 is allowed, --seq-len 1 is not.
inline CLI::Validator int_at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= lo) return {};
        } catch (const std::exception&) {
        }
        return "must be an integer >= " + std::to_string(lo) + ", got " + v;
      },
      "INT>=" + std::to_string(lo));
}

// Option check: a finite number >= 0 ("must be a finite number >= 0, got X").
inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && std::isfinite(x) && x >= 0) return {};
        } catch (const std::exception&) {
        }
        return "must be a finite number >= 0, got " + v;
      },
      "NUMBER>=0");
}

}  // namespace trident::cli

#define TRIDENT_CONCAT_(a, b) a##b
#define TRIDENT_CONCAT(a, b) TRIDENT_CONCAT_(a, b)
#define TRIDENT_COMMAND(...) \
  static const bool TRIDENT_CONCAT(trident_cmd_registered_, __LINE__) = ::trident::cli::register_command(__VA_ARGS__)
