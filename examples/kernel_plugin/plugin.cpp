// The plugin's entry points (golden/plugin.h): `trident check GOLDEN --backend plugin:libexample_kernels.so`.
#include <memory>

#include "example_kernels.h"
#include "golden/plugin.h"

TRIDENT_PLUGIN_ABI()

extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) {
  out->name = "example";
  out->f32 = [](trident::Device& d) { return std::make_unique<example::ExampleKernels<float>>(d); };
  out->f64 = [](trident::Device& d) { return std::make_unique<example::ExampleKernels<double>>(d); };
}
