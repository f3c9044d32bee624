// The plugin loader of golden/plugin.h.
#include "golden/plugin.h"

#include <dlfcn.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "reference/check.h"

namespace trident::golden {

namespace {

// dlerror()'s text on one line ("" when it has none).
std::string dl_message() {
  const char* e = dlerror();
  std::string s = e ? e : "";
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

const LoadedPlugin& load_plugin(const std::string& path) {
  namespace fs = std::filesystem;
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<LoadedPlugin>> loaded;  // never unloaded
  if (path.empty()) fail("plugin '': no path given (plugin:PATH.so)");
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec).lexically_normal();
  if (ec || !fs::exists(abs, ec)) fail(fmt::format("plugin '{}': no such file", path));
  if (!fs::is_regular_file(abs, ec)) fail(fmt::format("plugin '{}': not a regular file", path));
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(abs.string()); it != loaded.end()) return *it->second;

  dlerror();
  void* h = dlopen(abs.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const std::string why = dl_message();
    const bool undefined = why.find("undefined symbol") != std::string::npos;
    fail(fmt::format("plugin '{}': cannot load it: {}{}", path, why,
                     undefined ? " (a plugin takes Trident's code from this trident: build it against this "
                                 "installation and link no Trident library into it)"
                               : ""));
  }
  auto abi = reinterpret_cast<PluginAbiFn>(dlsym(h, "trident_plugin_abi"));
  if (!abi)
    fail(fmt::format("plugin '{}': no symbol trident_plugin_abi, so not a Trident kernel plugin (define it with "
                     "TRIDENT_PLUGIN_ABI() from golden/plugin.h)",
                     path));
  const trident_plugin_abi_info* info = abi();
  const char* version = info && info->trident_version ? info->trident_version : "(none)";
  if (!info || info->abi_version != TRIDENT_PLUGIN_ABI_VERSION || std::strcmp(version, kGenerator) != 0)
    fail(fmt::format("plugin '{}': built for plugin ABI {} and {}, this trident has plugin ABI {} and {}: rebuild it "
                     "against this installation",
                     path, info ? std::to_string(info->abi_version) : std::string("(none)"), version,
                     TRIDENT_PLUGIN_ABI_VERSION, kGenerator));
  auto entry = reinterpret_cast<PluginEntryV1>(dlsym(h, "trident_kernels_v1"));
  if (!entry)
    fail(fmt::format("plugin '{}': no symbol trident_kernels_v1 (the entry point of plugin ABI {}, golden/plugin.h)",
                     path, TRIDENT_PLUGIN_ABI_VERSION));
  auto lp = std::make_unique<LoadedPlugin>();
  lp->path = abs.string();
  try {
    entry(&lp->kernels);
  } catch (const std::exception& e) {
    fail(fmt::format("plugin '{}': trident_kernels_v1 threw: {}", path, e.what()));
  } catch (...) {
    fail(fmt::format("plugin '{}': trident_kernels_v1 threw a non-standard exception", path));
  }
  if (!lp->kernels.f32 && !lp->kernels.f64)
    fail(fmt::format("plugin '{}': trident_kernels_v1 gave no kernel set (neither f32 nor f64)", path));
  if (lp->kernels.name.empty()) lp->kernels.name = abs.filename().string();
  return *loaded.emplace(abs.string(), std::move(lp)).first->second;
}

}  // namespace trident::golden
