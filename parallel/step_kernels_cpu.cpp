// CpuKernels: the kernel set of the distributed step on the CPU = the reference ops (reference/model/*), each
// launched on its stream with the byte ranges it reads and writes. Every closure captures by value: in the
// emulator's deferred mode it runs after the call returned. Host metadata (tile segments, row lists) is copied.
#include "parallel/step_kernels.h"

#include <memory>

#include "reference/model/adamw.h"
#include "reference/model/linear_ce.h"
#include "reference/model/rows.h"

namespace trident {

namespace m = trident::model;

namespace {
// Host metadata (tile segments, row lists) a closure uses: a copy when the launch may run later, else the caller's.
struct Held {
  std::shared_ptr<const std::vector<int64_t>> copy;
  std::span<const int64_t> v;
};
Held hold(const Device& dev, std::span<const int64_t> v) {
  if (dev.immediate()) return {nullptr, v};
  if (!dev.has_data()) return {};  // shapes only: the launch never runs (v may be unread_rows)
  auto p = std::make_shared<const std::vector<int64_t>>(v.begin(), v.end());
  return {p, std::span<const int64_t>(*p)};
}
// The zig-zag gather slot of every key (m::zigzag_gather_rows), for a launch that may run later; none when it never
// runs (shapes only: S entries per call would cost more than the whole launch).
std::vector<int64_t> rows_of(const Device& dev, int64_t cp, int64_t S) {
  return dev.has_data() ? m::zigzag_gather_rows(cp, S / (2 * cp)) : std::vector<int64_t>{};
}
// Every kernel goes through here: on an immediate device the reference op runs at once (no std::function, no
// access list), else it is launched with its accesses.
template <class F>
void go(Device& dev, Stream s, std::string_view name, std::initializer_list<Access> acc, double flops, F&& fn,
        std::source_location loc) {
  if (dev.immediate()) {
    fn();
    return;
  }
  dev.launch(s, name, Accesses(acc), flops, std::function<void()>(std::forward<F>(fn)), loc);
}
template <class F>
void go(Device& dev, Stream s, std::string_view name, Accesses acc, double flops, F&& fn, std::source_location loc) {
  if (dev.immediate()) {
    fn();
    return;
  }
  dev.launch(s, name, acc, flops, std::function<void()>(std::forward<F>(fn)), loc);
}
template <class P>
Access rd(const P* p, int64_t n) {
  return reads(p, n);
}
template <class P>
Access wr(P* p, int64_t n) {
  return writes(p, n);
}
template <class P>
Access racc(P* p, int64_t n) {  // an accumulator added into: read and written
  return Access{p, n * static_cast<int64_t>(sizeof(P)), true};
}
// An indexed access whose range the kernel does not know (rows picked through an index list into a buffer of a
// size it is not given): to the end of the allocation for the hazard checker, `n` elements moved for the trace.
template <class P>
Access rd_indexed(const P* p, int64_t n) {
  return Access{p, kToEnd, false, n * static_cast<int64_t>(sizeof(P))};
}
template <class P>
Access wr_indexed(P* p, int64_t n) {
  return Access{p, kToEnd, true, n * static_cast<int64_t>(sizeof(P))};
}
// A read of `range` elements of which the kernel moves `n` (an embedding's gathered rows, a vocabulary slice's
// columns).
template <class P>
Access rd_part(const P* p, int64_t range, int64_t n) {
  return Access{p, range * static_cast<int64_t>(sizeof(P)), false, n * static_cast<int64_t>(sizeof(P))};
}
double gemm_flops(int64_t M, int64_t N, int64_t K) { return 2.0 * static_cast<double>(M) * N * K; }
// The (query, key) pairs an attention core call visits: the step's count (model::CoreDims::pairs) or, unknown, Nq
// queries times `keys` each.
double pairs_or(const m::CoreDims& cd, int64_t Nq, double keys) {
  return cd.pairs > 0 ? static_cast<double>(cd.pairs) : static_cast<double>(Nq) * keys;
}
// Elements a (rows, w) matrix of leading dimension ld spans: the last row ends at (rows-1) ld + w (a strided slice,
// e.g. the indexer key's columns of the payload, ends before the buffer does).
int64_t span_of(int64_t rows, int64_t w, int64_t ld) { return rows > 0 ? (rows - 1) * ld + w : 0; }
// The projection weights the attention kernels apply to every row (elements; reference/model/params.cpp shapes):
// attn_qkv_* wq, wk/wv (GQA) or wq, wdkv, wuk (MLA, wuk absorbed into the query); attn_out_* wo (and wuv, MLA). Each
// element is one multiply-add per row: a forward is 2 N x this many FLOPs, a backward (dgrad and wgrad) 4 N x.
double attn_in_weights(const m::Config& c) {
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.heads);
  if (c.attn == m::AttnKind::gqa) return d * H * c.head_dim + 2 * d * c.kv_heads * c.head_dim;
  return d * H * (c.nope_dim + c.rope_dim) + d * (c.kv_lora_rank + c.rope_dim) + c.kv_lora_rank * H * c.nope_dim;
}
// The weights attn_qkv_* reads (reference/model/params.cpp shapes; MLA adds kv_norm) and attn_out_*'s, as accesses
// of a view: AttnW (read) or AttnG (the exact gradient accumulators the backward adds into: read and written).
template <class V>
Accesses attn_in_access(const m::Config& c, const V& w, bool write) {
  const int64_t d = c.d_model, H = c.heads, Dh = c.head_dim, r = c.kv_lora_rank;
  const auto a = [write](const auto* p, int64_t n) {
    return Access{p, n * static_cast<int64_t>(sizeof(*p)), write};
  };
  if (c.attn == m::AttnKind::gqa)
    return {a(w.wq, d * H * Dh), a(w.wk, d * c.kv_heads * Dh), a(w.wv, d * c.kv_heads * Dh)};
  return {a(w.wq, d * H * (c.nope_dim + c.rope_dim)), a(w.wdkv, d * (r + c.rope_dim)), a(w.kv_norm, r),
          a(w.wuk, r * H * c.nope_dim)};
}
template <class V>
Accesses attn_out_access(const m::Config& c, const V& w, bool write) {
  const int64_t d = c.d_model, H = c.heads;
  const auto a = [write](const auto* p, int64_t n) {
    return Access{p, n * static_cast<int64_t>(sizeof(*p)), write};
  };
  if (c.attn == m::AttnKind::gqa) return {a(w.wo, H * c.head_dim * d)};
  return {a(w.wuv, c.kv_lora_rank * H * c.v_dim), a(w.wo, H * c.v_dim * d)};
}
Accesses operator+(Accesses a, const Accesses& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
// The partial buffers (and kv_norm's accumulators) of a partials view, written.
template <class T>
Accesses partial_access(const m::AttnGP<T>& g) {
  Accesses out;
  for (const TilePartials<T>* p : {&g.wq, &g.wk, &g.wv, &g.wo, &g.wdkv, &g.wuk, &g.wuv})
    if (*p) out.push_back(Access{p->base, p->size() * static_cast<int64_t>(sizeof(T)), true});
  return out;
}
double attn_out_weights(const m::Config& c) {
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.heads);
  if (c.attn == m::AttnKind::gqa) return H * c.head_dim * d;
  return c.kv_lora_rank * H * c.v_dim + H * c.v_dim * d;
}
// SwiGLU forward / dgrad launched under a name (the dense MLP and shared expert, or a routed expert).
template <class T>
void launch_swiglu_forward(Device& dev, std::string_view name, Policy pol, const T* x, const T* wg, const T* wu,
                           const T* wd, int64_t N, int64_t d, int64_t F, T* ug, T* uu, T* h, T* y, Stream s,
                           std::source_location loc) {
  go(dev, s, name,
     {rd(x, N * d), rd(wg, d * F), rd(wu, d * F), rd(wd, F * d), wr(ug, N * F), wr(uu, N * F), wr(h, N * F),
      wr(y, N * d)},
     3 * gemm_flops(N, F, d), [=] { m::swiglu_forward<T>(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y); }, loc);
}
template <class T>
void launch_swiglu_dgrad(Device& dev, std::string_view name, Policy pol, const T* dy, const T* wg, const T* wu,
                         const T* wd, const T* ug, const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx,
                         Stream s, std::source_location loc) {
  go(dev, s, name,
     {rd(dy, N * d), rd(wg, d * F), rd(wu, d * F), rd(wd, F * d), rd(ug, N * F), rd(uu, N * F), wr(dug, N * F),
      wr(duu, N * F), wr(dx, N * d)},
     3 * gemm_flops(N, F, d),
     [=] { m::swiglu_backward_dgrad<T>(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx); }, loc);
}
}  // namespace

template <class T>
void CpuKernels<T>::mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                       bool trans_b, T* C, int64_t ldc, Stream s, loc_t loc) {
  // B: (K, N) of leading dimension ldb, or (N, K) when trans_b
  go(dev_, s, "mm",
     {rd(A, span_of(M, K, lda)), rd(B, trans_b ? span_of(N, K, ldb) : span_of(K, N, ldb)), wr(C, span_of(M, N, ldc))},
     gemm_flops(M, N, K),
     [=] { m::mm<T>(pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc); }, loc);
}
template <class T>
void CpuKernels<T>::wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                              Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc) {
  const int64_t rows = segs.empty() ? 0 : segs.back();
  go(dev_, s, "wgrad_acc", {rd(X, span_of(rows, K, ldx)), rd(dY, span_of(rows, M, ldy)), racc(acc, K * M)},
     gemm_flops(K, M, rows),
     [=, sg = hold(dev_, segs)] { m::wgrad_acc<T>(pol, X, ldx, dY, ldy, K, M, sg.v, acc); }, loc);
}
template <class T>
bool CpuKernels<T>::wgrad_partials(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M,
                                   Segs segs, const TilePartials<T>& out, Stream s, loc_t loc) {
  const int64_t rows = segs.empty() ? 0 : segs.back();
  go(dev_, s, "wgrad_partials", {rd(X, span_of(rows, K, ldx)), rd(dY, span_of(rows, M, ldy)), wr(out.base, out.size())},
     gemm_flops(K, M, rows),
     [=, sg = hold(dev_, segs)] { m::wgrad_partials<T>(pol, X, ldx, dY, ldy, K, M, sg.v, out, M); }, loc);
  return true;
}
template <class T>
void CpuKernels<T>::sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc) {
  const int64_t rows = segs.empty() ? 0 : segs.back();
  go(dev_, s, "sum_acc", {rd(x, rows * J), racc(acc, J)}, static_cast<double>(rows * J),
     [=, sg = hold(dev_, segs)] { m::sum_acc<T>(x, J, sg.v, acc); }, loc);
}
template <class T>
void CpuKernels<T>::exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc) {
  go(dev_, s, "exact_round", {rd(acc, n), wr(out, n)}, 0, [=] { trident::exact_round<T>(acc, out, n); }, loc);
}
template <class T>
void CpuKernels<T>::embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V,
                                      Stream s, loc_t loc) {
  // embed (V, d): N rows of it gathered
  go(dev_, s, "embedding_forward",
     {rd(tokens, N), rd_part(embed, V * d, N * d), wr(out, N * d)},
     0,
     [=] { m::embedding_forward<T>(out, tokens, embed, N, d, V); }, loc);
}
template <class T>
bool CpuKernels<T>::embedding_backward_partials(const TilePartials<T>& dembed, const int32_t* tokens, const T* dout,
                                                int64_t N, int64_t d, Segs segs, Stream s, loc_t loc) {
  go(dev_, s, "embedding_backward_partials", {rd(tokens, N), rd(dout, N * d), wr(dembed.base, dembed.size())}, 0,
     [=, sg = hold(dev_, segs)] { m::embedding_backward_partials<T>(dembed, tokens, dout, N, d, sg.v); }, loc);
  return true;
}
template <class T>
void CpuKernels<T>::embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N,
                                       int64_t d, Segs segs, Stream s, loc_t loc) {
  // dembed: the table's accumulators or a row slice's (tokens are slots in it; its size unknown here): N rows added
  go(dev_, s, "embedding_backward",
     {rd(tokens, N), rd(dout, N * d), Access{dembed, kToEnd, true, N * d * static_cast<int64_t>(sizeof(*dembed))}}, 0,
     [=, sg = hold(dev_, segs)] { m::embedding_backward<T>(dembed, tokens, dout, N, d, sg.v); }, loc);
}
template <class T>
void CpuKernels<T>::rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                                    int64_t ldy, T* rinv, Stream s, loc_t loc) {
  go(dev_, s, "rmsnorm_forward", {rd(x, N * ldx), rd(g, d), wr(y, N * ldy), wr(rinv, N)},
     4.0 * static_cast<double>(N * d), [=] { m::rmsnorm_forward<T>(x, ldx, g, N, d, eps, y, ldy, rinv); }, loc);
}
template <class T>
void CpuKernels<T>::rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g,
                                     int64_t N, int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg,
                                     Stream s, loc_t loc) {
  go(dev_, s, "rmsnorm_backward",
     {rd(dy, N * lddy), rd(x, N * ldx), rd(rinv, N), rd(g, d), wr(dx, N * lddx), racc(dg, d)},
     8.0 * static_cast<double>(N * d),
     [=, sg = hold(dev_, segs)] { m::rmsnorm_backward<T>(dy, lddy, x, ldx, rinv, g, N, d, sg.v, dx, lddx, dg); }, loc);
}
template <class T>
void CpuKernels<T>::residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc) {
  go(dev_, s, "residual_forward", {rd(a, n), rd(b, n), wr(out, n)}, static_cast<double>(n),
     [=] { m::residual_forward<T>(out, a, b, n); }, loc);
}
template <class T>
void CpuKernels<T>::swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                       int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) {
  launch_swiglu_forward<T>(dev_, "swiglu_forward", pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
}
template <class T>
void CpuKernels<T>::swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                       const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) {
  launch_swiglu_dgrad<T>(dev_, "swiglu_backward_dgrad", pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
}
template <class T>
void CpuKernels<T>::expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d,
                       int64_t F, T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) {
  launch_swiglu_forward<T>(dev_, "expert_forward", pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
}
template <class T>
void CpuKernels<T>::expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                       const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) {
  launch_swiglu_dgrad<T>(dev_, "expert_backward_dgrad", pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
}
template <class T>
void CpuKernels<T>::router_forward(Policy pol, const T* a, const T* wr_, const T* bias, int64_t N, int64_t d,
                                   int64_t E, int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates,
                                   Stream s, loc_t loc) {
  go(dev_, s, "router_forward",
     {rd(a, N * d), rd(wr_, d * E), rd(bias, E), wr(logits, N * E), wr(scores, N * E), wr(sel, N * K),
      wr(gates, N * K)},
     gemm_flops(N, E, d),
     [=] { m::router_forward<T>(pol, a, wr_, bias, N, d, E, K, alpha, logits, scores, sel, gates); }, loc);
}
template <class T>
void CpuKernels<T>::router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E,
                                    int64_t K, double alpha, T* dlogits, Stream s, loc_t loc) {
  go(dev_, s, "router_backward", {rd(dgates, N * K), rd(scores, N * E), rd(sel, N * K), wr(dlogits, N * E)}, 0,
     [=] { m::router_backward<T>(dgates, scores, sel, N, E, K, alpha, dlogits); }, loc);
}
template <class T>
void CpuKernels<T>::moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K,
                                        Stream s, loc_t loc) {
  go(dev_, s, "moe_combine_forward", {rd(gates, N * K), rd(yk, N * K * d), wr(out, N * d)},
     2.0 * static_cast<double>(N * K * d), [=] { m::moe_combine_forward<T>(out, gates, yk, N, d, K); }, loc);
}
template <class T>
void CpuKernels<T>::moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk,
                                         int64_t d, int64_t K, T* dgates, T* dyk, Stream s, loc_t loc) {
  const int64_t n = static_cast<int64_t>(tk.size());
  // dout, gates, yk, dgates: indexed through tk (the token count, so their size, unknown here: to the end of the
  // allocation); n rows of each moved
  go(dev_, s, "moe_combine_backward",
     {rd_indexed(dout, n * d), rd_indexed(gates, n), rd_indexed(yk, n * d), wr_indexed(dgates, n), wr(dyk, n * d)},
     3.0 * static_cast<double>(n * d),
     [=, ix = hold(dev_, tk)] { m::moe_combine_backward<T>(dout, gates, yk, ix.v.data(), n, d, K, dgates, dyk); }, loc);
}
template <class T>
void CpuKernels<T>::moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s, loc_t loc) {
  go(dev_, s, "moe_dx_sum", {rd(dxk, N * K * d), wr(dx, N * d)}, static_cast<double>(N * K * d),
     [=] { m::moe_dx_sum<T>(dx, dxk, N, d, K); }, loc);
}
template <class T>
void CpuKernels<T>::gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) {
  const int64_t n = static_cast<int64_t>(idx.size());
  // src: indexed through idx, its row count unknown here
  go(dev_, s, "gather_rows", {rd_indexed(src, n * w), wr(dst, n * w)}, 0,
     [=, ix = hold(dev_, idx)] { m::gather_rows<T>(dst, src, ix.v, w); }, loc);
}
template <class T>
void CpuKernels<T>::scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) {
  const int64_t n = static_cast<int64_t>(idx.size());
  // dst: indexed through idx, its row count unknown here
  go(dev_, s, "scatter_rows", {rd(src, n * w), wr_indexed(dst, n * w)}, 0,
     [=, ix = hold(dev_, idx)] { m::scatter_rows<T>(dst, src, ix.v, w); }, loc);
}
template <class T>
void CpuKernels<T>::attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos,
                                     int64_t N, const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  go(dev_, s, "attn_qkv_forward",
     Accesses{rd(a, N * cfg.d_model), rd(pos, N), wr(acts.q, z.q), wr(acts.qc, z.qc), wr(acts.c, z.c),
              wr(acts.kv_rinv, z.kv_rinv), wr(acts.payload, z.payload)} +
         attn_in_access(cfg, W, false),
     2.0 * static_cast<double>(N) * attn_in_weights(cfg), [=, &cfg, &rope, A = acts] { m::attn_qkv_forward<T>(pol, cfg, W, a, pos, N, rope, A); }, loc);
}
template <class T>
void CpuKernels<T>::kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                                      loc_t loc) {
  go(dev_, s, "kv_zigzag_reorder", {rd(src, 2 * cp * block), wr(dst, 2 * cp * block)}, 0,
     [=] { m::kv_zigzag_reorder<T>(dst, src, cp, block, to_gather); }, loc);
}
template <class T>
void CpuKernels<T>::kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block,
                                            Stream s, loc_t loc) {
  go(dev_, s, "kv_zigzag_to_gather_acc", {wr(x, 2 * cp * block), wr(scratch, block)}, 0,
     [=] { m::kv_zigzag_to_gather_inplace(x, scratch, cp, block); }, loc);
}
template <class T>
void CpuKernels<T>::attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                      const T* kv, int64_t S, T* o, T* stats, Stream s, loc_t loc) {
  go(dev_, s, "attn_core_forward",
     {rd(q, Nq * cd.H * cd.Dq), rd(kv, S * cd.P), wr(o, Nq * cd.H * cd.Dv), wr(stats, Nq * cd.H * 2)},
     2.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=] { m::attn_core_forward<T>(pol, cd, q, qpos, Nq, kv, S, o, stats); }, loc);
}
template <class T>
void CpuKernels<T>::attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq,
                                       const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                                       T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc) {
  go(dev_, s, "attn_core_backward",
     {rd(q, Nq * cd.H * cd.Dq), rd(kv, S * cd.P), rd(o, Nq * cd.H * cd.Dv), rd(stats, Nq * cd.H * 2),
      rd(dO, Nq * cd.H * cd.Dv), wr(dq, Nq * cd.H * cd.Dq), wr(dkv, S * cd.P)},
     4.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=, sg = hold(dev_, qsegs)] {
       m::attn_core_backward<T>(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, sg.v, dq, dkv);
              }, loc);
}
template <class T>
bool CpuKernels<T>::attn_core_backward_gather(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                                              const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv, int64_t cp, Stream s,
                                              loc_t loc) {
  TD_CHECK(cp > 0 && S % (2 * cp) == 0, "attn_core_backward_gather: {} keys are not 2 x {} equal blocks", S, cp);
  go(dev_, s, "attn_core_backward_gather",
     {rd(q, Nq * cd.H * cd.Dq), rd(kv, S * cd.P), rd(o, Nq * cd.H * cd.Dv), rd(stats, Nq * cd.H * 2),
      rd(dO, Nq * cd.H * cd.Dv), wr(dq, Nq * cd.H * cd.Dq), wr(dkv, S * cd.P)},
     4.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=, sg = hold(dev_, qsegs), kr = rows_of(dev_, cp, S)] {
       m::attn_core_backward_rows<T>(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, sg.v, dq, dkv, kr);
     }, loc);
  return true;
}
template <class T>
bool CpuKernels<T>::attn_core_backward_partials(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                                int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                                                const T* dO, Segs qsegs, T* dq, T* part, int64_t cp, Stream s,
                                                loc_t loc) {
  TD_CHECK(cp > 0 && S % (2 * cp) == 0, "attn_core_backward_partials: {} keys are not 2 x {} equal blocks", S, cp);
  TD_CHECK(!qsegs.empty(), "attn_core_backward_partials: no query tiles");
  const int64_t nt = static_cast<int64_t>(qsegs.size()) - 1;
  go(dev_, s, "attn_core_backward_partials",
     {rd(q, Nq * cd.H * cd.Dq), rd(kv, S * cd.P), rd(o, Nq * cd.H * cd.Dv), rd(stats, Nq * cd.H * 2),
      rd(dO, Nq * cd.H * cd.Dv), wr(dq, Nq * cd.H * cd.Dq), wr(part, nt * S * cd.P)},
     4.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=, sg = hold(dev_, qsegs), kr = rows_of(dev_, cp, S)] {
       m::attn_core_backward_partials<T>(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, sg.v, dq, part, kr, S / cp);
     }, loc);
  return true;
}
template <class T>
void CpuKernels<T>::attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                          const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats,
                                          Stream s, loc_t loc) {
  go(dev_, s, "attn_doc_core_forward",
     {rd(q, Nq * cd.H * cd.Dq), rd(qdoc, Nq), rd(kv, S * cd.P), wr(o, Nq * cd.H * cd.Dv), wr(stats, Nq * cd.H * 2)},
     2.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=] { m::attn_doc_core_forward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats); }, loc);
}
template <class T>
void CpuKernels<T>::attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos,
                                           const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o,
                                           const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv, Stream s,
                                           loc_t loc) {
  go(dev_, s, "attn_doc_core_backward",
     {rd(q, Nq * cd.H * cd.Dq), rd(qdoc, Nq), rd(kv, S * cd.P), rd(o, Nq * cd.H * cd.Dv), rd(stats, Nq * cd.H * 2),
      rd(dO, Nq * cd.H * cd.Dv), wr(dq, Nq * cd.H * cd.Dq), wr(dkv, S * cd.P)},
     4.0 * pairs_or(cd, Nq, S) * cd.H * (cd.Dq + cd.Dv),
     [=, sg = hold(dev_, qsegs)] {
       m::attn_doc_core_backward<T>(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, sg.v, dq, dkv);
     }, loc);
}
template <class T>
void CpuKernels<T>::dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc,
                               int64_t Nq, const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc) {
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  go(dev_, s, "dsa_select", {rd(iq, Nq * Iw), rd(qpos, Nq), rd(qdoc, qdoc ? Nq : 0), rd(kv, S * cd.P),
                             wr(sel, Nq * cd.topk)},
     2.0 * pairs_or(cd, Nq, S / 2.0) * cd.Hi * (cd.Di + 1),  // unknown: causal, half the keys on average
     [=] { m::dsa_select<T>(pol, cd, iq, qpos, qdoc, Nq, kv, S, sel); }, loc);
}
template <class T>
void CpuKernels<T>::dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                                     int64_t Nq, const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl,
                                     Stream s, loc_t loc) {
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  go(dev_, s, "dsa_core_forward",
     {rd(q, Nq * cd.H * cd.Dq), rd(iq, Nq * Iw), rd(qpos, Nq), rd(kv, S * cd.P), rd(sel, Nq * cd.topk),
      wr(o, Nq * cd.H * cd.Dv), wr(stats, Nq * cd.H * 2), wr(ikl, ikl ? Nq : 0)},
     2.0 * pairs_or(cd, Nq, cd.topk) * (cd.H * (cd.Dq + cd.Dv) + (ikl ? cd.Hi * (cd.Di + 1) : 0)),
     [=] { m::dsa_core_forward<T>(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, ikl); }, loc);
}
template <class T>
void CpuKernels<T>::dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos,
                                      int64_t Nq, const T* kv, int64_t S, const int32_t* sel, const T* o,
                                      const T* stats, const T* dO, T iscale, Segs qsegs, T* dq, T* diq,
                                      ExactAcc<T>* dkv, Stream s, loc_t loc) {
  const int64_t Iw = cd.Hi * cd.Di + cd.Hi;
  go(dev_, s, "dsa_core_backward",
     {rd(q, Nq * cd.H * cd.Dq), rd(iq, Nq * Iw), rd(qpos, Nq), rd(kv, S * cd.P), rd(sel, Nq * cd.topk),
      rd(o, Nq * cd.H * cd.Dv), rd(stats, Nq * cd.H * 2), rd(dO, Nq * cd.H * cd.Dv), wr(dq, Nq * cd.H * cd.Dq),
      wr(diq, Nq * Iw), wr(dkv, S * cd.P)},
     4.0 * pairs_or(cd, Nq, cd.topk) * (cd.H * (cd.Dq + cd.Dv) + cd.Hi * (cd.Di + 1)),
     [=, sg = hold(dev_, qsegs)] {
       m::dsa_core_backward<T>(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, sg.v, dq, diq, dkv);
     }, loc);
}
template <class T>
void CpuKernels<T>::attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts,
                                     T* y, Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  go(dev_, s, "attn_out_forward",
     Accesses{rd(acts.o, z.o), wr(acts.ocat, z.ocat), wr(y, N * cfg.d_model)} + attn_out_access(cfg, W, false),
     2.0 * static_cast<double>(N) * attn_out_weights(cfg),
     [=, &cfg, A = acts] { m::attn_out_forward<T>(pol, cfg, W, N, A, y); }, loc);
}
template <class T>
void CpuKernels<T>::attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                                      const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  go(dev_, s, "attn_out_backward",
     Accesses{rd(acts.o, z.o), rd(acts.ocat, z.ocat), rd(dy, N * cfg.d_model), wr(dO, z.o)} +
         attn_out_access(cfg, W, false) + attn_out_access(cfg, G, true),
     4.0 * static_cast<double>(N) * attn_out_weights(cfg),
     [=, &cfg, A = acts, sg = hold(dev_, segs)] { m::attn_out_backward<T>(pol, cfg, W, G, N, A, dy, sg.v, dO); },
     loc);
}
template <class T>
void CpuKernels<T>::attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                                      const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts,
                                      const T* dqc, const T* dpayload, Segs segs, T* da, Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  go(dev_, s, "attn_qkv_backward",
     Accesses{rd(a, N * cfg.d_model), rd(pos, N), rd(acts.q, z.q), rd(acts.qc, z.qc), rd(acts.c, z.c),
              rd(acts.kv_rinv, z.kv_rinv), rd(acts.payload, z.payload), rd(dqc, z.qc), rd(dpayload, z.payload),
              wr(da, N * cfg.d_model)} +
         attn_in_access(cfg, W, false) + attn_in_access(cfg, G, true),
     4.0 * static_cast<double>(N) * attn_in_weights(cfg),
     [=, &cfg, &rope, A = acts, sg = hold(dev_, segs)] {
       m::attn_qkv_backward<T>(pol, cfg, W, G, a, pos, N, rope, A, dqc, dpayload, sg.v, da);
              }, loc);
}
template <class T>
bool CpuKernels<T>::attn_out_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G,
                                               int64_t N, const AttnBufs& acts, const T* dy, Segs segs, T* dO,
                                               Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  go(dev_, s, "attn_out_backward_partials",
     Accesses{rd(acts.o, z.o), rd(acts.ocat, z.ocat), rd(dy, N * cfg.d_model), wr(dO, z.o)} +
         attn_out_access(cfg, W, false) + partial_access(G),
     4.0 * static_cast<double>(N) * attn_out_weights(cfg),
     [=, &cfg, A = acts, sg = hold(dev_, segs)] { m::attn_out_backward<T>(pol, cfg, W, G, N, A, dy, sg.v, dO); },
     loc);
  return true;
}
template <class T>
bool CpuKernels<T>::attn_qkv_backward_partials(Policy pol, const Config& cfg, const AttnW& W, const AttnGP& G,
                                               const T* a, const int64_t* pos, int64_t N, const Rope& rope,
                                               const AttnBufs& acts, const T* dqc, const T* dpayload, Segs segs,
                                               T* da, Stream s, loc_t loc) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  Accesses kv_norm;
  if (G.kv_norm) kv_norm.push_back(Access{G.kv_norm, cfg.kv_lora_rank * static_cast<int64_t>(sizeof(ExactAcc<T>)), true});
  go(dev_, s, "attn_qkv_backward_partials",
     Accesses{rd(a, N * cfg.d_model), rd(pos, N), rd(acts.q, z.q), rd(acts.qc, z.qc), rd(acts.c, z.c),
              rd(acts.kv_rinv, z.kv_rinv), rd(acts.payload, z.payload), rd(dqc, z.qc), rd(dpayload, z.payload),
              wr(da, N * cfg.d_model)} +
         attn_in_access(cfg, W, false) + partial_access(G) + kv_norm,
     4.0 * static_cast<double>(N) * attn_in_weights(cfg),
     [=, &cfg, &rope, A = acts, sg = hold(dev_, segs)] {
       m::attn_qkv_backward<T>(pol, cfg, W, G, a, pos, N, rope, A, dqc, dpayload, sg.v, da);
     }, loc);
  return true;
}
template <class T>
void CpuKernels<T>::linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N,
                                      int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss,
                                      T* lse, Stream s, loc_t loc) {
  go(dev_, s, "linear_ce_forward",
     {rd(hidden, N * d), rd(W, d * V), rd(targets, N), wr(token_loss, N), wr(lse, N)}, gemm_flops(N, V, d),
     [=] { m::linear_ce_forward<T>(hidden, W, targets, N, d, V, vocab_chunk, pol, token_chunk, token_loss,
                                   lse); }, loc);
}
template <class T>
bool CpuKernels<T>::linear_ce_backward_partials(Policy pol, const T* hidden, const T* W, const int32_t* targets,
                                                const T* lse, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk,
                                                int64_t token_chunk, T grad_scale, Segs segs, int64_t j_begin,
                                                int64_t j_end, T* dhidden, const TilePartials<T>& dW, Stream s,
                                                loc_t loc) {
  go(dev_, s, "linear_ce_backward_partials",
     {rd(hidden, N * d), rd_part(W, d * V, d * (j_end - j_begin)), rd(targets, N), rd(lse, N), wr(dhidden, N * d),
      wr(dW.base, dW.size())},
     3 * gemm_flops(N, j_end - j_begin, d), [=, sg = hold(dev_, segs)] {
       m::linear_ce_backward_cols_partials<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, pol, token_chunk,
                                              grad_scale, sg.v, j_begin, j_end, dhidden, dW);
     }, loc);
  return true;
}
template <class T>
void CpuKernels<T>::linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse,
                                       int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                                       T grad_scale, Segs segs, int64_t j_begin, int64_t j_end, T* dhidden,
                                       ExactAcc<T>* dW, Stream s, loc_t loc) {
  go(dev_, s, "linear_ce_backward",
     // the columns [j_begin, j_end) of W moved; dW: (d, j_end - j_begin), the slice's accumulators
     {rd(hidden, N * d),
      rd_part(W, d * V, d * (j_end - j_begin)),
      rd(targets, N), rd(lse, N), wr(dhidden, N * d), racc(dW, d * (j_end - j_begin))},
     3 * gemm_flops(N, j_end - j_begin, d), [=, sg = hold(dev_, segs)] {
       m::linear_ce_backward_cols<T>(hidden, W, targets, lse, N, d, V, vocab_chunk, pol, token_chunk,
                                     grad_scale, sg.v, j_begin, j_end, dhidden, dW);
              }, loc);
}
template <class T>
void CpuKernels<T>::grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc) {
  go(dev_, s, "grad_sq_acc", {rd(g, n), wr(acc, 1)}, 2.0 * static_cast<double>(n),
     [=] { m::grad_sq_acc<T>(g, n, *acc); }, loc);
}
template <class T>
void CpuKernels<T>::adamw_step(T* w, const T* g, T* mm_, T* v, int64_t n, const m::AdamWHyper& hyper, int64_t step,
                               double clip, bool decay, Stream s, loc_t loc) {
  go(dev_, s, "adamw_step", {rd(g, n), wr(w, n), wr(mm_, n), wr(v, n)}, 12.0 * static_cast<double>(n),
     [=] { m::adamw_step<T>(w, g, mm_, v, n, hyper, step, clip, decay); }, loc);
}
template <class T>
void CpuKernels<T>::router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s, loc_t loc) {
  go(dev_, s, "router_bias_update", {rd(load, E), wr(b, E)}, 0,
     [=] { m::router_bias_update(b, load, E, gamma); }, loc);
}

template class CpuKernels<float>;
template class CpuKernels<double>;

}  // namespace trident
