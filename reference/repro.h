// ReproLine: the one builder of every printed repro line ("repro: trident emulate --preset tiny ..."). Every command
// (train, emulate, plan) and every test that prints a command line builds it here, so a line can be pasted into a
// shell as is: values are quoted when a shell would split or expand them, and doubles print in their shortest
// round-trip form (the same double comes back).
// Header-only and free of the model: the planner uses it too.
#pragma once
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <type_traits>

namespace trident {

class ReproLine {
 public:
  explicit ReproLine(std::string_view command) : s_(command) {}

  // A positional argument.
  ReproLine& arg(std::string_view v) {
    s_ += ' ';
    s_ += quote(v);
    return *this;
  }
  // "--flag value", always.
  template <class T>
  ReproLine& opt(std::string_view flag, const T& v) {
    s_ += fmt::format(" {} {}", flag, render(v));
    return *this;
  }
  // "--flag value" when the value differs from the flag's default.
  template <class T, class D>
  ReproLine& opt_if(std::string_view flag, const T& v, const D& dflt) {
    if (!(v == static_cast<T>(dflt))) opt(flag, v);
    return *this;
  }
  // "--flag value" when the value is not empty.
  ReproLine& opt_nonempty(std::string_view flag, std::string_view v) {
    if (!v.empty()) opt(flag, v);
    return *this;
  }
  // "--flag" when on.
  ReproLine& flag(std::string_view flag, bool on) {
    if (on) {
      s_ += ' ';
      s_ += flag;
    }
    return *this;
  }
  const std::string& str() const { return s_; }

  // A shell word for v: as is when it holds only characters no shell treats specially, else single-quoted.
  static std::string quote(std::string_view v) {
    const bool plain = !v.empty() && v.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789_-+=.,:/@%") == std::string_view::npos;
    if (plain) return std::string(v);
    std::string q = "'";
    for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }

 private:
  template <class T>
  static std::string render(const T& v) {
    if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
    else if constexpr (std::is_arithmetic_v<T>) return fmt::format("{}", v);  // doubles: shortest round trip
    else return quote(std::string_view(v));
  }
  std::string s_;
};

}  // namespace trident
