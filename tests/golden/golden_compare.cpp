// golden_compare NEW.h5 CHECKED_IN.h5: bitwise comparison of two state dumps (config, seed, inputs, loss, weights,
// grads, weights_after). Exit 0 when equal, 1 with the first difference otherwise. Used by the golden regression
// tests: the checked-in files in golden/data pin the reference's bits, which the emulator-vs-reference tests
// cannot do (both sides share the kernels).
#include <cstdio>
#include <exception>

#include "golden/state_dump.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: golden_compare NEW.h5 CHECKED_IN.h5\n");
    return 2;
  }
  try {
    auto fresh = trident::golden::read_state(argv[1]);
    const auto pinned = trident::golden::read_state(argv[2]);
    fresh.repro = pinned.repro;  // the repro line names the output path: metadata, not numerics
    const auto r = trident::golden::compare_states(fresh, pinned);
    if (r.equal) {
      std::printf("golden: %s == %s bitwise\n", argv[1], argv[2]);
      return 0;
    }
    std::printf("golden MISMATCH: %s\n  new %s vs checked-in %s\n", r.message.c_str(), argv[1], argv[2]);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_compare: error: %s\n", e.what());
    return 2;
  }
}
