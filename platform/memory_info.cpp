// platform/memory_info.h.
#include "platform/memory_info.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#if defined(__APPLE__)
#include <mach/mach.h>
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

namespace trident::platform {

double available_memory_bytes() {
#if defined(__linux__)
  double avail = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    double kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
    }
  }
  // cgroup v2 limit of this process's group
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (!path.empty()) {
    std::ifstream mx("/sys/fs/cgroup" + path + "/memory.max"), cur("/sys/fs/cgroup" + path + "/memory.current");
    std::string lim;
    double used = 0;
    if (mx >> lim && lim != "max" && cur >> used) {
      const double left = std::stod(lim) - used;
      if (avail == 0 || left < avail) avail = std::max(left, 0.0);
    }
  }
  return avail;
#elif defined(__APPLE__)
  vm_statistics64_data_t vs{};
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  vm_size_t page = 0;
  if (host_page_size(mach_host_self(), &page) == KERN_SUCCESS &&
      host_statistics64(mach_host_self(), HOST_VM_INFO64, reinterpret_cast<host_info64_t>(&vs), &count) ==
          KERN_SUCCESS)
    return (static_cast<double>(vs.free_count) + vs.inactive_count + vs.speculative_count) *
           static_cast<double>(page);
  uint64_t total = 0;
  size_t len = sizeof total;
  if (sysctlbyname("hw.memsize", &total, &len, nullptr, 0) == 0) return static_cast<double>(total);
  return 0;
#else
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
#endif
}

int64_t peak_rss_bytes() {
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
#else
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
  return static_cast<int64_t>(ru.ru_maxrss);  // bytes
#else
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // kilobytes
#endif
#endif
}

int64_t shared_rss_bytes() {
#if defined(__linux__) && !defined(TRIDENT_PORTABLE)
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0, sum = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "RssFile: %lld kB", &kb) == 1 || std::sscanf(line, "RssShmem: %lld kB", &kb) == 1) sum += kb;
  std::fclose(f);
  return sum * 1024;
#else
  return 0;
#endif
}

double cpu_seconds() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

}  // namespace trident::platform
