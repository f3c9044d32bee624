// Kernel-set plugins that are wrong on purpose, one per BAD_* define: `trident check --backend plugin:...` must
// refuse each with one `trident: error:` line (tests/install/CMakeLists.txt).
#if defined(BAD_NO_ABI)
// An entry point without trident_plugin_abi: not a Trident plugin.
extern "C" __attribute__((visibility("default"))) void trident_kernels_v1(void*) {}
#else
#include <stdexcept>

#include "golden/plugin.h"

#if defined(BAD_ABI_VERSION)
extern "C" TRIDENT_PLUGIN_EXPORT const trident_plugin_abi_info* trident_plugin_abi(void) {
  static const trident_plugin_abi_info info{TRIDENT_PLUGIN_ABI_VERSION + 1, ::trident::golden::kGenerator};
  return &info;
}
#elif defined(BAD_TRIDENT_VERSION)
extern "C" TRIDENT_PLUGIN_EXPORT const trident_plugin_abi_info* trident_plugin_abi(void) {
  static const trident_plugin_abi_info info{TRIDENT_PLUGIN_ABI_VERSION, "trident 0.0.1"};
  return &info;
}
#else
TRIDENT_PLUGIN_ABI()
#endif

#if defined(BAD_THROWS)
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels*) {
  throw std::runtime_error("this plugin needs a device it cannot find");
}
#elif defined(BAD_EMPTY)
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) { out->name = "empty"; }
#elif defined(BAD_UNDEFINED)
namespace trident {
void a_function_this_trident_lacks();  // defined nowhere: dlopen() must refuse the plugin
}
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels*) {
  trident::a_function_this_trident_lacks();
}
#elif defined(BAD_NO_F32)
// Only a Kernels<double>: the f32 goldens cannot be checked with it.
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) {
  out->f64 = [](trident::Device& d) { return std::make_unique<trident::CpuKernels<double>>(d); };
}
#elif !defined(BAD_NO_ENTRY)
// A valid entry point (ABI_VERSION, TRIDENT_VERSION: the version info is the fault).
extern "C" TRIDENT_PLUGIN_EXPORT void trident_kernels_v1(trident::golden::PluginKernels* out) {
  out->f32 = [](trident::Device& d) { return std::make_unique<trident::CpuKernels<float>>(d); };
}
#endif
#endif
