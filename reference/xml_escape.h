// Text for XML/SVG: & < > " escaped. Header-only (the planner and sim/ write SVG charts with it).
#pragma once
#include <string>
#include <string_view>

namespace trident {

inline std::string xml_escape(std::string_view s) {
  std::string o;
  for (char ch : s) {
    if (ch == '&') o += "&amp;";
    else if (ch == '<') o += "&lt;";
    else if (ch == '>') o += "&gt;";
    else if (ch == '"') o += "&quot;";
    else o += ch;
  }
  return o;
}

}  // namespace trident
