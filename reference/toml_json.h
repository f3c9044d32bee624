// TOML -> JSON, so TOML and JSON config files go through one validation path (model configs, planner inputs).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>
#include <toml.hpp>

namespace trident {

inline nlohmann::json toml_to_json(const toml::value& v) {
  switch (v.type()) {
    case toml::value_t::boolean: return v.as_boolean();
    case toml::value_t::integer: return static_cast<int64_t>(v.as_integer());
    case toml::value_t::floating: return static_cast<double>(v.as_floating());
    case toml::value_t::string: return static_cast<std::string>(v.as_string());
    case toml::value_t::array: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : v.as_array()) a.push_back(toml_to_json(e));
      return a;
    }
    case toml::value_t::table: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, e] : v.as_table()) o[k] = toml_to_json(e);
      return o;
    }
    default:  // dates and times mean nothing in a Trident config: keep them as text so the validator names the key
      return std::string("<toml date/time>");
  }
}

}  // namespace trident
