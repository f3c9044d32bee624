// Hardware models for the timeline simulator (sim/timeline.h): throughput per dtype, memory bandwidth, NVLink and
// InfiniBand bandwidth and latency, NVLink domain size. The models live in sim/hardware.json (compiled into the
// library; every number with its source); docs/timeline.md section 3 describes the fields.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/comm.h"

namespace trident::sim {

struct Hardware {
  std::string name, description;
  int nvl_domain = 8;                           // GPUs per NVLink domain (world ranks r / nvl_domain share one)
  std::map<std::string, double> gemm_tflops;      // dense tensor-core peak per dtype: "bf16", "f32", "f64"
  std::map<std::string, double> attention_tflops; // attention kernels per dtype
  double hbm_GBps = 0;                          // memory bandwidth (1e9 bytes/s)
  double nvlink_GBps = 0, nvlink_latency_us = 0;  // per GPU, per direction; per collective step
  double ib_GBps = 0, ib_latency_us = 0;          // scale-out NIC per GPU, per direction; per collective step
  double launch_us = 0;                           // fixed cost of every kernel
  std::map<std::string, std::string> sources;     // field -> where the number comes from

  // The throughput (FLOP/s) for a dtype key ("bf16", "f32", "f64"); throws naming the model and key.
  double gemm_flops(std::string_view dtype) const;
  double attention_flops(std::string_view dtype) const;
};

// The models of sim/hardware.json, in file order.
const std::vector<Hardware>& hardware_models();
// The model called `name` (case-insensitive); throws trident::Error naming --hardware and the known names.
const Hardware& hardware_model(std::string_view name);
// Parses a hardware file (the format of sim/hardware.json); throws on a missing or mistyped field.
std::vector<Hardware> parse_hardware(std::string_view json_text, std::string_view what);

}  // namespace trident::sim
