#include "sim/hardware.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "reference/check.h"
#include "sim_hardware_json.h"  // kHardwareJson: sim/hardware.json, generated at configure time

namespace trident::sim {
namespace {

double number(const nlohmann::json& j, const char* key, std::string_view what) {
  TD_CHECK(j.contains(key) && j[key].is_number(), "{}: field '{}' missing or not a number", what, key);
  const double v = j[key].get<double>();
  TD_CHECK(v >= 0, "{}: field '{}' must be >= 0, got {}", what, key, v);
  return v;
}

std::map<std::string, double> per_dtype(const nlohmann::json& j, const char* key, std::string_view what) {
  TD_CHECK(j.contains(key) && j[key].is_object(), "{}: field '{}' missing or not an object", what, key);
  std::map<std::string, double> m;
  for (const char* d : {"bf16", "f32", "f64"}) {
    TD_CHECK(j[key].contains(d) && j[key][d].is_number() && j[key][d].get<double>() > 0,
             "{}: {}.{} missing or not a positive number", what, key, d);
    m[d] = j[key][d].get<double>();
  }
  return m;
}

double lookup(const std::map<std::string, double>& m, std::string_view dtype, const std::string& model,
              const char* field) {
  const auto it = m.find(std::string(dtype));
  TD_CHECK(it != m.end(), "hardware model '{}': no {} for dtype '{}'", model, field, dtype);
  return it->second * 1e12;
}

}  // namespace

double Hardware::gemm_flops(std::string_view dtype) const { return lookup(gemm_tflops, dtype, name, "gemm_tflops"); }
double Hardware::attention_flops(std::string_view dtype) const {
  return lookup(attention_tflops, dtype, name, "attention_tflops");
}

std::vector<Hardware> parse_hardware(std::string_view text, std::string_view what) {
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  TD_CHECK(!j.is_discarded() && j.is_object() && j.contains("models") && j["models"].is_array(),
           "{}: not a JSON object with a 'models' array", what);
  std::vector<Hardware> out;
  for (const auto& m : j["models"]) {
    Hardware h;
    TD_CHECK(m.contains("name") && m["name"].is_string(), "{}: a model without a 'name'", what);
    h.name = m["name"].get<std::string>();
    const std::string w = fmt::format("{} model '{}'", what, h.name);
    h.description = m.value("description", "");
    h.nvl_domain = static_cast<int>(number(m, "nvl_domain", w));
    TD_CHECK(h.nvl_domain >= 1, "{}: nvl_domain must be >= 1", w);
    h.gemm_tflops = per_dtype(m, "gemm_tflops", w);
    h.attention_tflops = per_dtype(m, "attention_tflops", w);
    h.hbm_GBps = number(m, "hbm_GBps", w);
    h.nvlink_GBps = number(m, "nvlink_GBps", w);
    h.nvlink_latency_us = number(m, "nvlink_latency_us", w);
    h.ib_GBps = number(m, "ib_GBps", w);
    h.ib_latency_us = number(m, "ib_latency_us", w);
    h.launch_us = number(m, "launch_us", w);
    TD_CHECK(h.hbm_GBps > 0 && h.nvlink_GBps > 0 && h.ib_GBps > 0, "{}: bandwidths must be positive", w);
    TD_CHECK(m.contains("sources") && m["sources"].is_object(), "{}: no 'sources' object", w);
    for (const auto& [k, v] : m["sources"].items()) h.sources[k] = v.is_string() ? v.get<std::string>() : v.dump();
    for (const char* k : {"nvl_domain", "gemm_tflops", "attention_tflops", "hbm_GBps", "nvlink_GBps",
                          "nvlink_latency_us", "ib_GBps", "ib_latency_us", "launch_us"})
      TD_CHECK(h.sources.count(k), "{}: no source for '{}'", w, k);
    out.push_back(std::move(h));
  }
  TD_CHECK(!out.empty(), "{}: no models", what);
  return out;
}

const std::vector<Hardware>& hardware_models() {
  static const std::vector<Hardware> models = parse_hardware(kHardwareJson, "sim/hardware.json");
  return models;
}

const Hardware& hardware_model(std::string_view name) {
  auto lower = [](std::string_view s) {
    std::string r(s);
    for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return r;
  };
  std::string known;
  for (const Hardware& h : hardware_models()) {
    if (lower(h.name) == lower(name)) return h;
    known += (known.empty() ? "" : ", ") + h.name;
  }
  fail(fmt::format("unknown hardware model '{}': use --hardware with one of {}", name, known));
}

}  // namespace trident::sim
