// Where a long step is, for progress lines ("backward, layer 2/4"): written by the thread that computes (the
// reference model, or world rank 0 of a distributed step), read by a progress printer on another thread
// (cli::Ticker). One atomic word, so a reader never sees a stage with another stage's layer; reading a value that is
// one layer old is harmless. Writing it changes no result: it is never read by the computation.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace trident {

class StepProgress {
 public:
  enum class Stage : uint32_t { idle, forward, head, backward, embedding, optimizer };

  // layer: 0-based; layers: their count (0 where the stage has no layers).
  void set(Stage s, int64_t layer = -1, int64_t layers = 0) noexcept {
    const uint64_t l = static_cast<uint64_t>(layer + 1) & kMask, n = static_cast<uint64_t>(layers) & kMask;
    word_.store(static_cast<uint64_t>(s) << 56 | l << 28 | n, std::memory_order_relaxed);
  }

  // "forward, layer 3/4", "loss head", "backward, layer 1/4", "backward, embedding", "optimizer"; "" when idle.
  std::string describe() const {
    const uint64_t w = word_.load(std::memory_order_relaxed);
    const auto s = static_cast<Stage>(w >> 56);
    const int64_t layer = static_cast<int64_t>(w >> 28 & kMask) - 1, layers = static_cast<int64_t>(w & kMask);
    switch (s) {
      case Stage::idle: return {};
      case Stage::forward: return fmt::format("forward, layer {}/{}", layer + 1, layers);
      case Stage::head: return "loss head";
      case Stage::backward: return fmt::format("backward, layer {}/{}", layer + 1, layers);
      case Stage::embedding: return "backward, embedding";
      case Stage::optimizer: return "optimizer";
    }
    return {};
  }

 private:
  static constexpr uint64_t kMask = (uint64_t{1} << 28) - 1;
  std::atomic<uint64_t> word_{0};
};

}  // namespace trident
