// Strict config-text readers, so TOML and JSON config files go through one validation path (model configs,
// planner inputs):
//   toml_to_json       TOML document -> JSON; an integer or float literal outside int64 / double is an error
//                      naming the key (toml11 3.x would silently clamp it to the largest value).
//   check_toml_text    refuses text nested deeper than kMaxConfigNesting, and binary literals toml11 would overflow
//                      on, before toml11 sees it.
//   parse_json_strict  JSON text -> JSON; a duplicate key (nlohmann keeps the last one silently) or nesting deeper
//                      than kMaxConfigNesting is an error naming the key.
// Every error is a trident::Error.
#pragma once
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml.hpp>

#include "reference/check.h"

namespace trident {

// Deeper structures are refused (no Trident config nests more than 3 levels; recursive parsers and printers
// must not run out of stack on hostile input).
inline constexpr int kMaxConfigNesting = 64;

namespace detail {

// The source text of a TOML value (its literal), or "" when toml11 kept no location for it.
inline std::string toml_literal(const toml::value& v) {
  const toml::source_location loc = v.location();
  const std::string& line = loc.line_str();
  if (loc.column() == 0 || loc.column() - 1 >= line.size()) return {};
  return line.substr(loc.column() - 1, loc.region());
}

// Whether a TOML integer literal (sign, 0x/0o/0b prefix, underscores) fits int64. Unparsable text: false.
inline bool toml_int_literal_fits(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  bool neg = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    neg = text[0] == '-';
    text.erase(0, 1);
  }
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'o' || text[1] == 'b')) {
    base = text[1] == 'x' ? 16 : text[1] == 'o' ? 8 : 2;
    text.erase(0, 2);
  }
  if (text.empty()) return false;
  uint64_t mag = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), mag, base);
  if (ec != std::errc() || p != text.data() + text.size()) return false;
  return neg ? mag <= uint64_t{1} << 63 : mag <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

inline std::string toml_where(const toml::value& v) {
  const toml::source_location loc = v.location();
  return fmt::format("{}:{}", loc.file_name(), loc.line());
}

}  // namespace detail

// `key` is the dotted path of `v` (used in error messages): "attention.heads", "mesh.ranks[2]".
inline nlohmann::json toml_to_json(const toml::value& v, const std::string& key = "") {
  const std::string name = key.empty() ? "<root>" : key;
  switch (v.type()) {
    case toml::value_t::boolean: return v.as_boolean();
    case toml::value_t::integer: {
      const int64_t x = static_cast<int64_t>(v.as_integer());
      // toml11 3.x reads integers with operator>>, which clamps an out-of-range literal to INT64_MAX / INT64_MIN:
      // only those two values can hide an overflow, so only they are re-read from the source text.
      if (x == std::numeric_limits<int64_t>::max() || x == std::numeric_limits<int64_t>::min()) {
        const std::string lit = detail::toml_literal(v);
        if (!detail::toml_int_literal_fits(lit))
          fail(fmt::format("TOML key '{}' ({}): integer {} is out of range (int64: -2^63 .. 2^63-1)", name,
                           detail::toml_where(v), lit.empty() ? std::to_string(x) : lit));
      }
      return x;
    }
    case toml::value_t::floating: {
      const double x = static_cast<double>(v.as_floating());
      // Likewise an overflowing float literal reads as +-DBL_MAX (or +-inf): re-read those from the text
      // (strtod: ERANGE for an overflow, no error for the literal inf).
      if (std::fabs(x) == std::numeric_limits<double>::max() || std::isinf(x)) {
        std::string lit = detail::toml_literal(v);
        lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
        if (!lit.empty()) {
          errno = 0;
          (void)std::strtod(lit.c_str(), nullptr);
          if (errno == ERANGE)
            fail(fmt::format("TOML key '{}' ({}): number {} is out of range (larger than the largest double)", name,
                             detail::toml_where(v), lit));
        }
      }
      return x;
    }
    case toml::value_t::string: return static_cast<std::string>(v.as_string());
    case toml::value_t::array: {
      nlohmann::json a = nlohmann::json::array();
      size_t i = 0;
      for (const auto& e : v.as_array()) a.push_back(toml_to_json(e, fmt::format("{}[{}]", name, i++)));
      return a;
    }
    case toml::value_t::table: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, e] : v.as_table()) o[k] = toml_to_json(e, key.empty() ? k : key + "." + k);
      return o;
    }
    default:  // dates and times mean nothing in a Trident config: keep them as text so the validator names the key
      return std::string("<toml date/time>");
  }
}

// A multi-line parser message (toml11 draws the offending line with a gutter) as one line.
inline std::string one_line(const std::string& msg) {
  std::string out;
  bool space = false;
  for (char c : msg) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

// Checks TOML text before toml11 (3.x) sees it, for what toml11 would mishandle: nesting of arrays, inline tables
// and dotted keys deeper than kMaxConfigNesting (it parses and destroys them recursively: a deep enough input would
// overflow the stack), and binary integer literals of 63 or more digits (it accumulates them in a signed int64,
// an overflow: undefined behaviour, in practice a silently wrapped value). Strings and comments are skipped.
inline void check_toml_text(std::string_view text, const std::string& source) {
  int depth = 0, line_dots = 0, worst = 0;
  size_t line = 1, line_start = 0;
  auto check = [&] {
    worst = std::max(worst, depth + line_dots);
    if (worst > kMaxConfigNesting)
      fail(fmt::format("{}:{}: TOML nesting deeper than {} levels", source, line, kMaxConfigNesting));
  };
  auto is_word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'; };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      line_dots = 0;
      line_start = i + 1;
    } else if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multi = text.substr(i, 3) == std::string(3, c);
      const std::string_view close = multi ? std::string_view(c == '"' ? "\"\"\"" : "'''") : std::string_view(&text[i], 1);
      i += multi ? 3 : 1;
      while (i < text.size() && text.substr(i, close.size()) != close) {
        if (text[i] == '\\' && c == '"') ++i;  // basic strings escape; literal strings do not
        else if (text[i] == '\n') {
          ++line;
          line_start = i + 1;
          if (!multi) break;  // an unterminated one-line string: toml11 reports it
        }
        ++i;
      }
      i += close.size() - 1;
    } else if (c == '[' || c == '{') {
      ++depth;
      check();
    } else if (c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
    } else if (c == '.') {
      ++line_dots;
      check();
    } else if (c == '0' && i + 1 < text.size() && text[i + 1] == 'b' && (i == 0 || !is_word(text[i - 1]))) {
      size_t j = i + 2, digits = 0;
      for (; j < text.size() && (text[j] == '0' || text[j] == '1' || text[j] == '_'); ++j) digits += text[j] != '_';
      if (digits >= 63) {
        const std::string_view l = text.substr(line_start, i - line_start);
        const size_t eq = l.find('=');
        std::string key(eq == std::string_view::npos ? std::string_view("<array element>") : l.substr(0, eq));
        while (!key.empty() && key.back() == ' ') key.pop_back();
        fail(fmt::format("TOML key '{}' ({}:{}): binary integer {} has {} digits: out of range (toml11 reads at "
                         "most 62 into an int64)",
                         key, source, line, text.substr(i, std::min<size_t>(j - i, 80)), digits));
      }
      i = j - 1;
    }
  }
}

// JSON text -> JSON, strictly (see the top of this file). `source` starts every error message (a file name).
inline nlohmann::json parse_json_strict(std::string_view text, const std::string& source) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::vector<std::string> path;            // the key being read in each open object
  auto dotted = [&] {
    std::string s;
    for (const auto& k : path) s += (s.empty() ? "" : ".") + k;
    return s;
  };
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    if (depth > kMaxConfigNesting)
      fail(fmt::format("{}: JSON nesting deeper than {} levels (at '{}')", source, kMaxConfigNesting, dotted()));
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        path.emplace_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        if (keys.empty()) break;
        path.back() = k;
        if (!keys.back().insert(k).second) fail(fmt::format("{}: duplicate JSON key '{}'", source, dotted()));
        break;
      }
      case json::parse_event_t::object_end:
        if (!keys.empty()) {
          keys.pop_back();
          path.pop_back();
        }
        break;
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail(fmt::format("{}: cannot parse JSON: {}", source, e.what()));
  }
}

}  // namespace trident
