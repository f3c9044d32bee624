// The `trident` front door: one binary, one subcommand per cli/cmd_*.cpp file.
// Each file registers itself with TRIDENT_COMMAND; main() builds the CLI11 app from the registry.
#pragma once
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "platform/memory_info.h"
#include "reference/check.h"
#include "reference/progress.h"

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

// Peak resident set of this process (platform/memory_info.h), bytes; 0 where unavailable.
inline int64_t peak_rss_bytes() { return platform::peak_rss_bytes(); }

// One progress line per step, the same for train and emulate:
// "step   2/3  loss 6.178918  grad_norm 1.1003  clip 0.9088  [####      ]  67%  0.24 s/step  0.48 s"
// (metrics: the step's numbers; elapsed: seconds since the first step started; done/total: steps of this run).
inline void print_step_line(int64_t step, int64_t last_step, int64_t done, int64_t total, const std::string& metrics,
                            double elapsed) {
  const int width = 30;
  const int fill = total > 0 ? static_cast<int>(width * done / total) : width;
  std::printf("step %3lld/%lld  %s  [%.*s%*s] %3.0f%%  %.2f s/step  %.2f s\n", static_cast<long long>(step),
              static_cast<long long>(last_step), metrics.c_str(), fill, "##############################",
              width - fill, "", total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
              done > 0 ? elapsed / static_cast<double>(done) : 0.0, elapsed);
  std::fflush(stdout);
}

// Progress inside long work: while nothing was printed for `period` seconds, prints "  ... WHAT: 20 s so far" (what
// is running now, set by note()), so a step of a large mesh is never silent for long.
// The period is 10 s, or TRIDENT_PROGRESS_SECONDS (a number in [0.01, 3600]) when set.
class Ticker {
 public:
  explicit Ticker(std::string what) : what_(std::move(what)), period_(period_from_env()) {
    last_ = since_ = std::chrono::steady_clock::now();
    th_ = std::thread([this] { loop(); });
  }
  ~Ticker() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    th_.join();
  }
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;
  // Inside the work, `where` tells how far it is ("backward, layer 2/4"; reference/progress.h): added to the line.
  void watch(const StepProgress* where) {
    std::lock_guard lk(m_);
    where_ = where;
  }
  // A line was printed and `what` runs now.
  void note(std::string what) {
    std::lock_guard lk(m_);
    what_ = std::move(what);
    last_ = since_ = std::chrono::steady_clock::now();
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    while (!stop_) {
      const auto due = last_ + std::chrono::duration<double>(period_);
      if (cv_.wait_until(lk, std::chrono::time_point_cast<std::chrono::steady_clock::duration>(due),
                         [&] { return stop_; }))
        break;
      const auto now = std::chrono::steady_clock::now();
      if (now < last_ + std::chrono::duration<double>(period_)) continue;
      const std::string at = where_ ? where_->describe() : std::string();
      std::printf("  ... %s%s: %.0f s so far\n", what_.c_str(), at.empty() ? "" : (" (" + at + ")").c_str(),
                  std::chrono::duration<double>(now - since_).count());
      std::fflush(stdout);
      last_ = now;
    }
  }
  static double period_from_env() {
    const char* e = std::getenv("TRIDENT_PROGRESS_SECONDS");
    if (!e) return 10.0;
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (end == e || *end != '\0' || !(v >= 0.01 && v <= 3600))
      throw Error(std::string("TRIDENT_PROGRESS_SECONDS must be a number of seconds in [0.01, 3600], got '") + e + "'");
    return v;
  }
  std::string what_;
  const StepProgress* where_ = nullptr;
  double period_;
  std::chrono::steady_clock::time_point last_, since_;
  bool stop_ = false;
  std::mutex m_;
  std::condition_variable cv_;
  std::thread th_;
};

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
