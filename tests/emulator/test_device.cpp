// The emulator's Device (emulator/device.h): memory tracking, eager and deferred execution, and the stream-hazard
// checker that names both launches of an unordered conflicting pair.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "emulator/world.h"
#include "tests/error_of.h"

namespace trident {
namespace {

using emu::DeviceMode;
using emu::DeviceOptions;
using emu::EmuDevice;

DeviceOptions deferred(uint64_t seed) {
  DeviceOptions o;
  o.mode = DeviceMode::deferred;
  o.seed = seed;
  return o;
}

// Fills a with v on stream s (a stand-in kernel).
void fill(Device& d, Stream s, float* a, int64_t n, float v, const char* name = "fill") {
  d.launch(s, name, {writes(a, n)}, 0, [=] { std::fill_n(a, n, v); });
}
// b = a + 1 on stream s.
void inc(Device& d, Stream s, const float* a, float* b, int64_t n, const char* name = "inc") {
  d.launch(s, name, {reads(a, n), writes(b, n)}, 0, [=] {
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] + 1;
  });
}

using trident::test::error_of;

TEST(Device, MemoryIsTrackedAndFreedInStreamOrder) {
  for (DeviceMode mode : {DeviceMode::eager, DeviceMode::deferred}) {
    RankTrace tr;
    DeviceOptions o;
    o.mode = mode;
    EmuDevice ed(0, tr, o);
    Device& d = ed;
    const Stream s = d.compute_stream();
    {
      DeviceBuffer<float> a(d, 1000, s), b(d, 500, s);
      EXPECT_EQ(d.memory().cur, 6000);
      EXPECT_EQ(d.memory().peak, 6000);
      fill(d, s, a.data(), 1000, 2.f);
      d.copy(b.data(), a.data(), 2000, s);
      const std::vector<float> h = d.fetch(b.data(), 500, s);
      EXPECT_EQ(h[499], 2.f);
    }
    ed.finish();
    EXPECT_EQ(d.memory().cur, 0);
    EXPECT_EQ(d.memory().peak, 6000);
  }
}

TEST(Device, UploadConsumesTheHostBufferAtOnce) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(1));
  Device& d = ed;
  const Stream s = d.compute_stream();
  DeviceBuffer<int64_t> a(d, 4, s);
  std::vector<int64_t> h{1, 2, 3, 4};
  d.upload(a.data(), h.data(), a.bytes(), s);
  h.assign(4, -1);  // reused before the upload ran: the device still gets 1, 2, 3, 4
  EXPECT_EQ(d.fetch(a.data(), 4, s), (std::vector<int64_t>{1, 2, 3, 4}));
}

// A correct two-stream pipeline gives the same values in eager mode and under every deferred seed.
TEST(Device, DeferredRunsEveryLegalOrderToTheSameValues) {
  auto run = [](DeviceOptions o) {
    RankTrace tr;
    EmuDevice ed(0, tr, o);
    Device& d = ed;
    const Stream a = d.compute_stream(), b = d.comm_stream();
    const Event ea = d.create_event(), eb = d.create_event();
    DeviceBuffer<float> x(d, 64, a), y(d, 64, a), z(d, 64, a);
    d.record(ea, a);
    d.wait(b, ea);  // b may use the buffers allocated on a
    fill(d, a, x.data(), 64, 1.f);
    d.record(ea, a);
    d.wait(b, ea);
    inc(d, b, x.data(), y.data(), 64, "inc on b");
    fill(d, a, z.data(), 64, 5.f, "independent fill on a");
    d.record(eb, b);
    d.wait(a, eb);
    inc(d, a, y.data(), x.data(), 64, "inc on a");
    std::vector<float> out = d.fetch(x.data(), 64, a);
    out.push_back(d.fetch(z.data(), 64, a)[0]);
    ed.finish();
    return out;
  };
  const std::vector<float> want = run(DeviceOptions{});
  EXPECT_EQ(want[0], 3.f);
  for (uint64_t seed = 0; seed < 20; ++seed) EXPECT_EQ(run(deferred(seed)), want) << "seed " << seed;
}

// Deferred mode really defers: work runs only when something needs it.
TEST(Device, DeferredWorkRunsOnlyWhenNeeded) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(3));
  Device& d = ed;
  const Stream s = d.compute_stream();
  DeviceBuffer<float> x(d, 8, s);
  int ran = 0;
  d.launch(s, "count", {writes(x.data(), 8)}, 0, [&ran] { ++ran; });
  EXPECT_EQ(ran, 0);
  d.synchronize(s);
  EXPECT_EQ(ran, 1);
}

// The acceptance case: remove the wait between a producer on one stream and a consumer on another.
TEST(Device, MissingWaitIsCaughtWithBothLaunchNames) {
  for (DeviceOptions o : {deferred(0), deferred(7), [] {
                            DeviceOptions e;
                            e.check_hazards = true;  // the checker also runs in eager mode
                            return e;
                          }()}) {
    RankTrace tr;
    EmuDevice ed(0, tr, o);
    Device& d = ed;
    const Stream a = d.compute_stream(), b = d.comm_stream();
    const Event e = d.create_event();
    DeviceBuffer<float> x(d, 16, a), y(d, 16, a);
    d.record(e, a);
    d.wait(b, e);
    fill(d, a, x.data(), 16, 1.f, "producer_gemm");
    // d.record(e, a); d.wait(b, e);   <- the missing wait
    const std::string msg = error_of([&] { inc(d, b, x.data(), y.data(), 16, "consumer_gather"); });
    EXPECT_NE(msg.find("stream hazard"), std::string::npos) << msg;
    EXPECT_NE(msg.find("consumer_gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find("producer_gemm"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_device.cpp"), std::string::npos) << msg;  // call sites
  }
}

TEST(Device, WriteAfterReadOnAnotherStreamIsCaught) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(0));
  Device& d = ed;
  const Stream a = d.compute_stream(), b = d.comm_stream();
  const Event e = d.create_event();
  DeviceBuffer<float> x(d, 16, a), y(d, 16, a);
  fill(d, a, x.data(), 16, 1.f);
  d.record(e, a);
  d.wait(b, e);
  inc(d, b, x.data(), y.data(), 16, "reader_on_b");
  const std::string msg = error_of([&] { fill(d, a, x.data(), 16, 9.f, "overwrite_on_a"); });
  EXPECT_NE(msg.find("overwrite_on_a"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reader_on_b"), std::string::npos) << msg;
}

TEST(Device, DisjointRangesAndSameStreamAreNotHazards) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(0));
  Device& d = ed;
  const Stream a = d.compute_stream(), b = d.comm_stream();
  const Event e = d.create_event();
  DeviceBuffer<float> x(d, 32, a);
  d.record(e, a);
  d.wait(b, e);
  fill(d, a, x.data(), 16, 1.f);          // first half on a
  fill(d, b, x.data() + 16, 16, 2.f);     // second half on b: disjoint bytes
  fill(d, a, x.data(), 16, 3.f);          // same stream, program order
  d.synchronize(a);
  d.synchronize(b);
  const std::vector<float> h = d.fetch(x.data(), 32, a);
  EXPECT_EQ(h[0], 3.f);
  EXPECT_EQ(h[31], 2.f);
}

// The host reads a result only after synchronizing the stream that produced it; a launch ordered after the host
// synchronize is ordered after everything the host saw.
TEST(Device, HostSynchronizeOrdersLaterWork) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(5));
  Device& d = ed;
  const Stream a = d.compute_stream(), b = d.comm_stream();
  DeviceBuffer<float> x(d, 8, a), y(d, 8, a);
  fill(d, a, x.data(), 8, 4.f);
  d.synchronize(a);
  inc(d, b, x.data(), y.data(), 8);  // no event: the host sync orders it
  EXPECT_EQ(d.fetch(y.data(), 8, b)[7], 5.f);
}

TEST(Device, EarlyHostReadSeesPoisonInDeferredMode) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(0));
  Device& d = ed;
  const Stream s = d.compute_stream();
  DeviceBuffer<float> x(d, 4, s);
  fill(d, s, x.data(), 4, 1.f);
  float h[4] = {0, 0, 0, 0};
  d.download(h, x.data(), sizeof h, s);
  EXPECT_EQ(h[0], 0.f);  // not yet copied: the host must synchronize first
  d.synchronize(s);
  EXPECT_EQ(h[0], 1.f);
}

TEST(Device, FreeWhileAnotherStreamUsesTheBufferIsCaught) {
  const std::string msg = error_of([] {
    RankTrace tr;
    EmuDevice ed(0, tr, deferred(0));
    Device& d = ed;
    const Stream a = d.compute_stream(), b = d.comm_stream();
    const Event e = d.create_event();
    DeviceBuffer<float> y(d, 8, a);
    {
      DeviceBuffer<float> x(d, 8, a);
      fill(d, a, x.data(), 8, 1.f);
      d.record(e, a);
      d.wait(b, e);
      inc(d, b, x.data(), y.data(), 8, "late_reader");
    }  // x freed on a while b may still read it
    ed.finish();
  });
  EXPECT_NE(msg.find("free"), std::string::npos) << msg;
  EXPECT_NE(msg.find("late_reader"), std::string::npos) << msg;
}

TEST(Device, StrictMemoryRejectsHostPointers) {
  RankTrace tr;
  DeviceOptions o = deferred(0);
  o.strict_memory = true;
  EmuDevice ed(0, tr, o);
  Device& d = ed;
  std::vector<float> host(4);
  const std::string msg = error_of([&] { fill(d, d.compute_stream(), host.data(), 4, 1.f, "host_fill"); });
  EXPECT_NE(msg.find("host_fill"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no Device::allocate"), std::string::npos) << msg;
}

TEST(Device, AccessPastAnAllocationIsCaught) {
  RankTrace tr;
  EmuDevice ed(0, tr, deferred(0));
  Device& d = ed;
  DeviceBuffer<float> x(d, 4, d.compute_stream());
  const std::string msg = error_of([&] { fill(d, d.compute_stream(), x.data(), 5, 1.f, "overrun"); });
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
}

// Collectives are operations of their stream: a collective that reads what a kernel on another stream wrote,
// without a wait, is a hazard on every rank.
TEST(Device, CollectiveWithoutWaitIsCaught) {
  emu::SpawnOptions so;
  so.device = deferred(0);
  try {
    emu::spawn(2, [](emu::RankContext& ctx) {
      Device& d = ctx.device();
      const Stream a = ctx.compute_stream(), b = ctx.comm_stream();
      const Event e = d.create_event();
      DeviceBuffer<float> x(d, 8, a), y(d, 16, a);
      d.record(e, a);
      d.wait(b, e);
      fill(d, a, x.data(), 8, 1.f, "shard_update");
      ctx.world().all_gather(x.data(), y.data(), 8, DataType::f32, b);
    }, so);
    FAIL() << "expected a hazard";
  } catch (const emu::RankError& e) {
    EXPECT_NE(e.original.find("all_gather"), std::string::npos) << e.original;
    EXPECT_NE(e.original.find("shard_update"), std::string::npos) << e.original;
  }
}

TEST(Device, CollectivesRunAfterTheirStreamInDeferredMode) {
  emu::SpawnOptions so;
  so.device = deferred(11);
  emu::spawn(4, [](emu::RankContext& ctx) {
    Device& d = ctx.device();
    const Stream a = ctx.compute_stream(), b = ctx.comm_stream();
    const Event e = d.create_event();
    DeviceBuffer<float> x(d, 8, a), y(d, 32, a);
    fill(d, a, x.data(), 8, static_cast<float>(ctx.rank()));
    d.record(e, a);
    d.wait(b, e);
    ctx.world().all_gather(x.data(), y.data(), 8, DataType::f32, b);
    const std::vector<float> h = d.fetch(y.data(), 32, b);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(h[static_cast<size_t>(r * 8)], static_cast<float>(r));
  }, so);
}

}  // namespace
}  // namespace trident
