// Memory queries: what this process may still use, and its own peak resident set.
//
// available_memory_bytes(): Linux: MemAvailable of /proc/meminfo, lowered by a cgroup v2 memory limit when one is
// set (the machine's memory can exceed a container's); macOS: free + inactive + speculative pages
// (host_statistics64), else hw.memsize (sysctl); elsewhere the free pages sysconf reports.
// peak_rss_bytes(): VmHWM of /proc/self/status on Linux by default; getrusage's ru_maxrss with TRIDENT_PORTABLE
// and elsewhere (kilobytes on Linux, bytes on macOS).
// shared_rss_bytes(): RssFile + RssShmem of /proc/self/status on Linux (resident pages other processes may map too:
// the program, its libraries, shared-memory segments); 0 with TRIDENT_PORTABLE and elsewhere.
// cpu_seconds(): user + system CPU time of this process, every thread (getrusage RUSAGE_SELF).
#pragma once
#include <cstdint>

namespace trident::platform {

// Bytes; 0 when unknown.
double available_memory_bytes();
// Bytes; 0 when unknown.
int64_t peak_rss_bytes();
// Bytes; 0 when unknown.
int64_t shared_rss_bytes();
// Seconds; 0 when unknown.
double cpu_seconds();

}  // namespace trident::platform
