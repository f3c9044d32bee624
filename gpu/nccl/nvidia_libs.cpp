#include "gpu/nccl/nvidia_libs.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

namespace trident::nccl {
namespace {

std::vector<std::string> glob_dirs(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), GLOB_ONLYDIR | GLOB_NOSORT, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> nvidia_wheel_dirs(const std::string& pkg) {
  std::vector<std::string> prefixes;
  for (const char* v : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* p = std::getenv(v); p && *p) prefixes.emplace_back(p);
  std::vector<std::string> site_dirs;
  if (const char* pp = std::getenv("PYTHONPATH"); pp && *pp) {
    std::string s = pp;
    for (size_t b = 0, e; b <= s.size(); b = e + 1) {
      e = s.find(':', b);
      if (e == std::string::npos) e = s.size();
      if (e > b) site_dirs.push_back(s.substr(b, e - b));
    }
  }
  if (const char* h = std::getenv("HOME"); h && *h) prefixes.push_back(std::string(h) + "/.local");
  for (const char* p : {"/usr/local", "/usr", "/opt/conda"}) prefixes.emplace_back(p);
  for (const std::string& p : prefixes)
    for (const char* kind : {"site-packages", "dist-packages"}) {
      for (const std::string& d : glob_dirs(p + "/lib/python3*/" + kind)) site_dirs.push_back(d);
      if (std::filesystem::is_directory(p + "/lib/python3/" + kind)) site_dirs.push_back(p + "/lib/python3/" + kind);
    }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const std::string& s : site_dirs) {
    const std::string d = s + "/nvidia/" + pkg + "/lib";
    std::error_code ec;
    if (std::filesystem::is_directory(d, ec) && seen.insert(d).second) out.push_back(d);
  }
  return out;
}

void* dlopen_nvidia(const std::vector<std::string>& sonames, const std::string& pkg, std::string* tried) {
  auto attempt = [&](const std::string& p) -> void* {
    void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h && tried) {
      const char* e = dlerror();
      *tried += (tried->empty() ? "" : "; ") + std::string(e ? e : p.c_str());
    }
    return h;
  };
  for (const std::string& n : sonames)
    if (void* h = attempt(n)) return h;
  for (const std::string& d : nvidia_wheel_dirs(pkg))
    for (const std::string& n : sonames)
      if (std::filesystem::exists(d + "/" + n))
        if (void* h = attempt(d + "/" + n)) return h;
  if (tried) *tried += "; no " + sonames.front() + " in the wheel folders nvidia/" + pkg + "/lib of site-packages";
  return nullptr;
}

std::string library_path(void* handle) {
  link_map* m = nullptr;
  if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &m) != 0 || !m || !m->l_name) return {};
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::canonical(m->l_name, ec);
  return ec ? std::string(m->l_name) : p.string();
}

}  // namespace trident::nccl
