// Error handling for all of Trident's library code: checks throw trident::Error with both sides printed.
// Library code never ends the process: one failing fake rank must not take the others down.
#pragma once
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace trident {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }

namespace detail {
[[noreturn]] inline void check_failed(const char* expr, const std::string& msg, std::source_location loc) {
  throw Error(fmt::format("{} ({}:{}: check '{}' failed)", msg.empty() ? "internal error" : msg,
                          loc.file_name(), loc.line(), expr));
}
}  // namespace detail

}  // namespace trident

// TD_CHECK(cond, "format {}", args...): throws trident::Error with the message and the location.
#define TD_CHECK(cond, ...)                                                                              \
  do {                                                                                                   \
    if (!(cond)) [[unlikely]]                                                                            \
      ::trident::detail::check_failed(#cond, ::fmt::format("" __VA_ARGS__), std::source_location::current()); \
  } while (0)

// TD_CHECK_EQ(a, b, ...): prints both values.
#define TD_CHECK_OP_(a, b, op, ...)                                                                    \
  do {                                                                                                 \
    const auto& td_a_ = (a);                                                                           \
    const auto& td_b_ = (b);                                                                           \
    if (!(td_a_ op td_b_)) [[unlikely]]                                                                \
      ::trident::detail::check_failed(#a " " #op " " #b,                                               \
                                      ::fmt::format("{} (" #a " = {}, " #b " = {})",                   \
                                                    ::fmt::format("" __VA_ARGS__), td_a_, td_b_),      \
                                      std::source_location::current());                                \
  } while (0)
#define TD_CHECK_EQ(a, b, ...) TD_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define TD_CHECK_NE(a, b, ...) TD_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define TD_CHECK_LT(a, b, ...) TD_CHECK_OP_(a, b, <, __VA_ARGS__)
#define TD_CHECK_LE(a, b, ...) TD_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define TD_CHECK_GT(a, b, ...) TD_CHECK_OP_(a, b, >, __VA_ARGS__)
#define TD_CHECK_GE(a, b, ...) TD_CHECK_OP_(a, b, >=, __VA_ARGS__)
