// Test helper: the message of the trident::Error a call throws, or "" when it throws none.
#pragma once
#include <functional>
#include <string>

#include "reference/check.h"

namespace trident::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace trident::test
