// What ran on each stream of one rank, in order: the raw material of a timeline (overlap of compute and
// communication) and of collective accounting. Backend-agnostic: the emulator records it for every call; a GPU
// backend may record the same (plus timings).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace trident {

struct TraceEntry {
  // alloc / free: a device allocation or free of `bytes` bytes, stream-ordered on this stream (Device::allocate /
  // free); what the device's current and peak memory are made of, so a replay can follow memory over time.
  enum class Kind : uint8_t { compute, collective, send, recv, record, wait, alloc, free };
  Kind kind = Kind::compute;
  std::string name;         // compute: the launch name; communication: the op name; record/wait: "record"/"wait";
                            // alloc/free: "alloc"/"free"
  // communication
  std::string comm;         // communicator name ("world", "fsdp*cp", ...)
  int64_t comm_id = -1;     // backend id of the communicator (unique within a run)
  uint64_t seq = 0;         // collective: sequence number on the communicator; send/recv: per (sender, receiver);
                            // all_to_all(v) (recorded as one collective entry): count of such calls
  CollOp op = CollOp::all_gather;
  DataType dtype = DataType::f32;
  ReduceOp redop = ReduceOp::sum;
  uint64_t count = 0;       // NCCL count argument
  int peer = -1;            // broadcast/reduce: root; send/recv: peer (communicator rank)
  uint64_t recv_hash = 0;   // communication: hash of the bytes this rank received (FNV-1a 64 unless the device
                            // chose XXH64, emulator/trace_hash.h; 0: none received or not
                            // recorded, e.g. the all_to_all helpers); a failing backend's first differing collective
  // sizes
  int64_t bytes = 0;        // communication: OpStats bytes; compute: the launch's bytes; alloc/free: the size
  int64_t recv_bytes = -1;  // all_to_all(v): the bytes this rank received (-1: not recorded, or another op)
  double flops = 0;
  // events (record: the event recorded; wait: the event and where its last record() sits)
  int event = -1;
  int event_stream = -1;
  int64_t event_index = -1;  // index of the record entry in event_stream's list
  int64_t issue = -1;       // the rank's issue order across all its streams (0, 1, ...): cross-stream "before"
  // call site
  const char* file = "";
  unsigned line = 0;
};

struct StreamTrace {
  std::string name;                 // "compute", "comm", or create_stream()'s name
  std::vector<TraceEntry> entries;  // in issue order
};

using RankTrace = std::vector<StreamTrace>;  // indexed by Stream::id

}  // namespace trident
