// Kernel-set plugins (docs/plugins.md): a shared library built outside this tree against an installed Trident,
// which `trident check GOLDEN --backend plugin:PATH.so` (and `trident paired`) loads with dlopen() to recompute a
// primitive golden with the plugin's Kernels<T>.
//
// A plugin exports two C symbols:
//   trident_plugin_abi()    plain C, read first: the plugin ABI version and the Trident version the plugin was built
//                           with. TRIDENT_PLUGIN_ABI() defines it from this header's values.
//   trident_kernels_v1(out) fills a PluginKernels: the factories of its Kernels<float> (f32 cases: the fp32 and bf16
//                           policies) and Kernels<double> (f64 cases).
// A plugin links no Trident library: its references to Trident (CpuKernels<T>'s ops it inherits, the Device it
// launches on) bind to the definitions of the `trident` executable that loads it (which exports its symbols). So it
// must be built against the installation whose `trident` runs it; the loader refuses another plugin ABI version or
// another Trident version, and dlopen() refuses a plugin that needs a symbol this `trident` lacks.
//
//   TRIDENT_PLUGIN_ABI()
//   extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) {
//     out->name = "mykernels";
//     out->f32 = [](trident::Device& d) { return std::make_unique<MyKernels<float>>(d); };
//     out->f64 = [](trident::Device& d) { return std::make_unique<MyKernels<double>>(d); };
//   }
#pragma once
#include <cstdint>
#include <string>

#include "golden/primitives/primitives.h"
#include "golden/state_dump.h"

// The plugin ABI: changes (and the entry point's name with it: trident_kernels_v<N>) when the entry points,
// PluginKernels, KernelsFactory, Kernels<T> or Device change their layout or meaning.
#define TRIDENT_PLUGIN_ABI_VERSION 1

extern "C" {
// What trident_plugin_abi() returns (static storage).
struct trident_plugin_abi_info {
  uint32_t abi_version;          // TRIDENT_PLUGIN_ABI_VERSION of the headers the plugin was built with
  const char* trident_version;   // trident::golden::kGenerator of those headers, e.g. "trident 0.1.0"
};
}

#define TRIDENT_PLUGIN_EXPORT __attribute__((visibility("default")))
// Defines trident_plugin_abi() with this header's values; once per plugin, at namespace scope.
#define TRIDENT_PLUGIN_ABI()                                                                             \
  extern "C" TRIDENT_PLUGIN_EXPORT const trident_plugin_abi_info* trident_plugin_abi(void) {            \
    static const trident_plugin_abi_info info{TRIDENT_PLUGIN_ABI_VERSION, ::trident::golden::kGenerator}; \
    return &info;                                                                                        \
  }

namespace trident::golden {

// What trident_kernels_v1 fills in.
struct PluginKernels {
  std::string name;             // shown in messages (default: the file name)
  KernelsFactory<float> f32;    // the kernel set for f32 cases; empty: the plugin has none
  KernelsFactory<double> f64;   // the kernel set for f64 cases; empty: the plugin has none
};
using PluginAbiFn = const trident_plugin_abi_info* (*)();
using PluginEntryV1 = void (*)(PluginKernels*);

struct LoadedPlugin {
  std::string path;  // absolute
  PluginKernels kernels;
};
// Loads the plugin at `path` (relative to the working directory; a bare file name is not searched for on the
// library path) once per process and keeps it loaded (its kernel sets may outlive any caller). Throws
// trident::Error, one line naming the path, for: no such file, a file dlopen() refuses (not a shared library, a
// symbol this process lacks), no trident_plugin_abi, another plugin ABI or Trident version, no trident_kernels_v1,
// an entry point that throws or gives no kernel set.
const LoadedPlugin& load_plugin(const std::string& path);

}  // namespace trident::golden
