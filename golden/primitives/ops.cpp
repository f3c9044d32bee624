// One bind function per Kernels<T> op (golden/primitives/bind.h), the op table, the recording and perturbed kernel
// sets, and run_case.
#include <algorithm>
#include <bit>
#include <limits>
#include <map>

#include "emulator/device.h"
#include "golden/primitives/bind.h"
#include "reference/model/params.h"
#include "golden/primitives/accept.h"
#include "reference/tolerances.h"

namespace trident::golden {

namespace m = trident::model;
using detail::Binder;
using detail::kMaxScalar;
using detail::Mode;

namespace {

using V = std::vector<int64_t>;
using Segs = std::span<const int64_t>;

int64_t max_plus_one(Segs v) {
  int64_t mx = -1;
  for (int64_t x : v) mx = std::max(mx, x);
  return mx + 1;
}
int64_t longest_tile(Segs segs) {
  int64_t L = 0;
  for (size_t i = 1; i < segs.size(); ++i) L = std::max(L, segs[i] - segs[i - 1]);
  return L;
}

// Shapes of the attention weights of a config (layer 0: every layer has the same attention).
V attn_weight_shape(const m::Config& cfg, const std::string& field) {
  for (const m::ParamInfo& p : m::param_layout(cfg))
    if (p.name == "layers.0.attn." + field) return p.shape;
  fail(fmt::format("attention weight '{}' is not part of this config", field));
}
std::vector<std::string> attn_fields(const m::Config& cfg) {
  if (cfg.attn == m::AttnKind::gqa) return {"wq", "wk", "wv", "wo"};
  return {"wq", "wdkv", "kv_norm", "wuk", "wuv", "wo"};
}
template <class T, class View>
auto field_ptr(View& v, const std::string& f) {
  if (f == "wq") return &v.wq;
  if (f == "wk") return &v.wk;
  if (f == "wv") return &v.wv;
  if (f == "wo") return &v.wo;
  if (f == "wdkv") return &v.wdkv;
  if (f == "kv_norm") return &v.kv_norm;
  if (f == "wuk") return &v.wuk;
  return &v.wuv;
}
template <class T>
m::AttnW<T> bind_w(Binder<T>& b, const m::Config& cfg, const m::AttnW<T>& W) {
  m::AttnW<T> out;
  for (const std::string& f : attn_fields(cfg)) {
    const std::string nm = "W." + f;
    *field_ptr<T>(out, f) = b.in(nm.c_str(), *field_ptr<T>(const_cast<m::AttnW<T>&>(W), f), attn_weight_shape(cfg, f));
  }
  return out;
}
template <class T>
m::AttnG<T> bind_g(Binder<T>& b, const m::Config& cfg, const m::AttnG<T>& G, std::vector<std::string> fields) {
  m::AttnG<T> out;
  const bool mla = cfg.attn == m::AttnKind::mla;
  for (const std::string& f : fields) {
    if (mla && (f == "wk" || f == "wv")) continue;
    if (!mla && (f == "wdkv" || f == "kv_norm" || f == "wuk" || f == "wuv")) continue;
    const std::string nm = "G." + f;
    *field_ptr<T>(out, f) = b.acc(nm.c_str(), *field_ptr<T>(const_cast<m::AttnG<T>&>(G), f), attn_weight_shape(cfg, f));
  }
  return out;
}
// Activation buffers: role 'i' input, 'o' output, '-' unused (null).
template <class T>
m::AttnBufs<T> bind_acts(Binder<T>& b, const m::Config& cfg, int64_t N, const m::AttnBufs<T>& A, const char* roles) {
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  m::AttnBufs<T> out;
  const std::pair<const char*, std::pair<T* m::AttnBufs<T>::*, int64_t>> fields[] = {
      {"acts.q", {&m::AttnBufs<T>::q, z.q}},         {"acts.qc", {&m::AttnBufs<T>::qc, z.qc}},
      {"acts.c", {&m::AttnBufs<T>::c, z.c}},         {"acts.kv_rinv", {&m::AttnBufs<T>::kv_rinv, z.kv_rinv}},
      {"acts.payload", {&m::AttnBufs<T>::payload, z.payload}}, {"acts.o", {&m::AttnBufs<T>::o, z.o}},
      {"acts.stats", {&m::AttnBufs<T>::stats, z.stats}},       {"acts.ocat", {&m::AttnBufs<T>::ocat, z.ocat}}};
  for (size_t i = 0; i < 8; ++i) {
    const auto& [name, mem] = fields[i];
    const auto [ptr, n] = mem;
    if (n == 0 || roles[i] == '-') continue;
    if (roles[i] == 'i')
      out.*ptr = const_cast<T*>(b.in(name, A.*ptr, {n}));
    else
      out.*ptr = b.out(name, A.*ptr, {n});
  }
  return out;
}

// ---- the ops ---------------------------------------------------------------------------------------------------
template <class T>
void bind_mm(Binder<T>& b, Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
             int64_t ldb, bool trans_b, T* C, int64_t ldc) {
  pol = b.pol(pol);
  M = b.i("M", M), N = b.i("N", N), K = b.i("K", K);
  lda = b.i("lda", lda), ldb = b.i("ldb", ldb), ldc = b.i("ldc", ldc);
  trans_b = b.flag("trans_b", trans_b);
  b.require(M == 0 || lda >= K, "lda {} < K {}", lda, K);
  b.require(ldb >= (trans_b ? K : N) || (trans_b ? N : K) == 0, "ldb {} too small", ldb);
  b.require(M == 0 || ldc >= N, "ldc {} < N {}", ldc, N);
  A = b.in("A", A, {M, lda});
  B = b.in("B", B, {trans_b ? N : K, ldb});
  C = b.out("C", C, {M, ldc});
  b.call([&] { b.k().mm(pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc, b.s()); });
}
template <class T>
void bind_wgrad_acc(Binder<T>& b, Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K,
                    int64_t M, Segs segs, ExactAcc<T>* acc) {
  pol = b.pol(pol);
  ldx = b.i("ldx", ldx), ldy = b.i("ldy", ldy), K = b.i("K", K), M = b.i("M", M);
  segs = b.host("segs", segs);
  b.segments("segs", segs, -1);
  const int64_t rows = segs.empty() ? 0 : segs.back();
  b.require(rows == 0 || (ldx >= K && ldy >= M), "ldx {} < K {} or ldy {} < M {}", ldx, K, ldy, M);
  X = b.in("X", X, {rows, ldx});
  dY = b.in("dY", dY, {rows, ldy});
  acc = b.acc("acc", acc, {K, M});
  b.call([&] { b.k().wgrad_acc(pol, X, ldx, dY, ldy, K, M, segs, acc, b.s()); });
}
template <class T>
void bind_sum_acc(Binder<T>& b, const T* x, int64_t J, Segs segs, ExactAcc<T>* acc) {
  J = b.i("J", J);
  segs = b.host("segs", segs);
  b.segments("segs", segs, -1);
  const int64_t rows = segs.empty() ? 0 : segs.back();
  x = b.in("x", x, {rows, J});
  acc = b.acc("acc", acc, {J});
  b.call([&] { b.k().sum_acc(x, J, segs, acc, b.s()); });
}
template <class T>
void bind_exact_round(Binder<T>& b, const ExactAcc<T>* acc, T* out, int64_t n) {
  n = b.i("n", n);
  ExactAcc<T>* a = b.acc_in("acc", const_cast<ExactAcc<T>*>(acc), {n}, false);
  out = b.out("out", out, {n});
  b.call([&] { b.k().exact_round(a, out, n, b.s()); });
}
template <class T>
void bind_embedding_forward(Binder<T>& b, T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d,
                            int64_t V) {
  N = b.i("N", N), d = b.i("d", d), V = b.i("V", V);
  tokens = b.in("tokens", tokens, {N});
  b.template in_range<int32_t>("tokens", 0, V);
  embed = b.in("embed", embed, {V, d});
  out = b.out("out", out, {N, d});
  b.call([&] { b.k().embedding_forward(out, tokens, embed, N, d, V, b.s()); });
}
template <class T>
void bind_embedding_backward(Binder<T>& b, ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N,
                             int64_t d, Segs segs, int64_t rows_hint) {
  N = b.i("N", N), d = b.i("d", d);
  const int64_t rows = b.i("rows", rows_hint);
  segs = b.host("segs", segs);
  b.segments("segs", segs, N);
  tokens = b.in("tokens", tokens, {N});
  b.template in_range<int32_t>("tokens", 0, rows, -1);
  dout = b.in("dout", dout, {N, d});
  dembed = b.acc("dembed", dembed, {rows, d});
  b.call([&] { b.k().embedding_backward(dembed, tokens, dout, N, d, segs, b.s()); });
}
template <class T>
void bind_rmsnorm_forward(Binder<T>& b, const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y,
                          int64_t ldy, T* rinv) {
  ldx = b.i("ldx", ldx), N = b.i("N", N), d = b.i("d", d), ldy = b.i("ldy", ldy);
  eps = b.f("eps", eps);
  b.require(N == 0 || (ldx >= d && ldy >= d), "ldx {} or ldy {} < d {}", ldx, ldy, d);
  x = b.in("x", x, {N, ldx});
  g = b.in("g", g, {d});
  y = b.out("y", y, {N, ldy});
  rinv = b.out("rinv", rinv, {N});
  b.call([&] { b.k().rmsnorm_forward(x, ldx, g, N, d, eps, y, ldy, rinv, b.s()); });
}
template <class T>
void bind_rmsnorm_backward(Binder<T>& b, const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv,
                           const T* g, int64_t N, int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg) {
  lddy = b.i("lddy", lddy), ldx = b.i("ldx", ldx), N = b.i("N", N), d = b.i("d", d), lddx = b.i("lddx", lddx);
  segs = b.host("segs", segs);
  b.segments("segs", segs, N);
  b.require(N == 0 || (lddy >= d && ldx >= d && lddx >= d), "a leading dimension < d {}", d);
  dy = b.in("dy", dy, {N, lddy});
  x = b.in("x", x, {N, ldx});
  rinv = b.in("rinv", rinv, {N});
  g = b.in("g", g, {d});
  dx = b.out("dx", dx, {N, lddx});
  dg = b.acc("dg", dg, {d});
  b.call([&] { b.k().rmsnorm_backward(dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg, b.s()); });
}
template <class T>
void bind_residual_forward(Binder<T>& b, T* out, const T* a, const T* c, int64_t n) {
  n = b.i("n", n);
  a = b.in("a", a, {n});
  c = b.in("b", c, {n});
  out = b.out("out", out, {n});
  b.call([&] { b.k().residual_forward(out, a, c, n, b.s()); });
}
template <class T, bool kExpert>
void bind_swiglu_forward(Binder<T>& b, Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N,
                         int64_t d, int64_t F, T* ug, T* uu, T* h, T* y) {
  pol = b.pol(pol);
  N = b.i("N", N), d = b.i("d", d), F = b.i("F", F);
  x = b.in("x", x, {N, d});
  wg = b.in("wg", wg, {d, F});
  wu = b.in("wu", wu, {d, F});
  wd = b.in("wd", wd, {F, d});
  ug = b.out("ug", ug, {N, F});
  uu = b.out("uu", uu, {N, F});
  h = b.out("h", h, {N, F});
  y = b.out("y", y, {N, d});
  b.call([&] {
    if constexpr (kExpert)
      b.k().expert_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, b.s());
    else
      b.k().swiglu_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, b.s());
  });
}
template <class T, bool kExpert>
void bind_swiglu_dgrad(Binder<T>& b, Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug,
                       const T* uu, int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx) {
  pol = b.pol(pol);
  N = b.i("N", N), d = b.i("d", d), F = b.i("F", F);
  dy = b.in("dy", dy, {N, d});
  wg = b.in("wg", wg, {d, F});
  wu = b.in("wu", wu, {d, F});
  wd = b.in("wd", wd, {F, d});
  ug = b.in("ug", ug, {N, F});
  uu = b.in("uu", uu, {N, F});
  dug = b.out("dug", dug, {N, F});
  duu = b.out("duu", duu, {N, F});
  dx = b.out("dx", dx, {N, d});
  b.call([&] {
    if constexpr (kExpert)
      b.k().expert_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, b.s());
    else
      b.k().swiglu_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, b.s());
  });
}
template <class T>
void bind_router_forward(Binder<T>& b, Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d,
                         int64_t E, int64_t K, double alpha, T* logits, T* scores, int32_t* sel, T* gates) {
  pol = b.pol(pol);
  N = b.i("N", N), d = b.i("d", d), E = b.i("E", E), K = b.i("K", K);
  alpha = b.f("alpha", alpha);
  b.require(N == 0 || (K >= 1 && K <= E), "top-K {} outside [1, E = {}]", K, E);
  a = b.in("a", a, {N, d});
  wr = b.in("wr", wr, {d, E});
  bias = b.in("bias", bias, {E});
  logits = b.out("logits", logits, {N, E});
  scores = b.out("scores", scores, {N, E});
  sel = b.out("sel", sel, {N, K});
  gates = b.out("gates", gates, {N, K});
  b.call([&] { b.k().router_forward(pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates, b.s()); });
}
template <class T>
void bind_router_backward(Binder<T>& b, const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E,
                          int64_t K, double alpha, T* dlogits) {
  N = b.i("N", N), E = b.i("E", E), K = b.i("K", K);
  alpha = b.f("alpha", alpha);
  dgates = b.in("dgates", dgates, {N, K});
  scores = b.in("scores", scores, {N, E});
  sel = b.in("sel", sel, {N, K});
  b.template in_range<int32_t>("sel", 0, E);
  dlogits = b.out("dlogits", dlogits, {N, E});
  b.call([&] { b.k().router_backward(dgates, scores, sel, N, E, K, alpha, dlogits, b.s()); });
}
template <class T>
void bind_moe_combine_forward(Binder<T>& b, T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K) {
  N = b.i("N", N), d = b.i("d", d), K = b.i("K", K);
  gates = b.in("gates", gates, {N, K});
  yk = b.in("yk", yk, {N * K, d});
  out = b.out("out", out, {N, d});
  b.call([&] { b.k().moe_combine_forward(out, gates, yk, N, d, K, b.s()); });
}
template <class T>
void bind_moe_combine_backward(Binder<T>& b, const T* dout, const T* gates, const T* yk, Segs tk, int64_t d,
                               int64_t K, T* dgates, T* dyk) {
  d = b.i("d", d), K = b.i("K", K);
  tk = b.host("tk", tk);
  b.template in_range<int64_t>("tk", 0, kMaxScalar);
  b.require(tk.empty() || K >= 1, "K is 0 with {} rows listed", tk.size());
  const int64_t n = static_cast<int64_t>(tk.size());
  const int64_t N = K > 0 ? (max_plus_one(tk) + K - 1) / K : 0;  // tokens spanned by the listed entries
  dout = b.in("dout", dout, {N, d});
  gates = b.in("gates", gates, {N, K});
  yk = b.in("yk", yk, {N * K, d});
  dgates = b.out("dgates", dgates, {N, K});
  dyk = b.out("dyk", dyk, {n, d});
  b.call([&] { b.k().moe_combine_backward(dout, gates, yk, tk, d, K, dgates, dyk, b.s()); });
}
template <class T>
void bind_moe_dx_sum(Binder<T>& b, T* dx, const T* dxk, int64_t N, int64_t d, int64_t K) {
  N = b.i("N", N), d = b.i("d", d), K = b.i("K", K);
  dxk = b.in("dxk", dxk, {N * K, d});
  dx = b.out("dx", dx, {N, d});
  b.call([&] { b.k().moe_dx_sum(dx, dxk, N, d, K, b.s()); });
}
template <class T>
void bind_gather_rows(Binder<T>& b, T* dst, const T* src, Segs idx, int64_t w) {
  w = b.i("w", w);
  idx = b.host("idx", idx);
  b.template in_range<int64_t>("idx", 0, kMaxScalar);
  src = b.in("src", src, {max_plus_one(idx), w});
  dst = b.out("dst", dst, {static_cast<int64_t>(idx.size()), w});
  b.call([&] { b.k().gather_rows(dst, src, idx, w, b.s()); });
}
template <class T>
void bind_scatter_rows(Binder<T>& b, T* dst, const T* src, Segs idx, int64_t w) {
  w = b.i("w", w);
  idx = b.host("idx", idx);
  b.template in_range<int64_t>("idx", 0, kMaxScalar);
  src = b.in("src", src, {static_cast<int64_t>(idx.size()), w});
  dst = b.out("dst", dst, {max_plus_one(idx), w});
  b.call([&] { b.k().scatter_rows(dst, src, idx, w, b.s()); });
}
template <class T>
void bind_attn_qkv_forward(Binder<T>& b, Policy pol, const m::Config& cfg_, const m::AttnW<T>& W_, const T* a,
                           const int64_t* pos, int64_t N, const m::RopeTable<T>& rope_, const m::AttnBufs<T>& acts_) {
  pol = b.pol(pol);
  const m::Config& cfg = b.config(cfg_);
  N = b.i("N", N);
  const m::RopeTable<T>& rope = b.rope(rope_);
  b.require(rope.D == cfg.rope_width(), "rope width {}, the config's is {}", rope.D, cfg.rope_width());
  a = b.in("a", a, {N, cfg.d_model});
  pos = b.in("pos", pos, {N});
  b.template in_range<int64_t>("pos", 0, rope.max_pos);
  const m::AttnW<T> W = bind_w(b, cfg, W_);
  const m::AttnBufs<T> acts = bind_acts(b, cfg, N, acts_, "ooooo---");
  b.call([&] { b.k().attn_qkv_forward(pol, cfg, W, a, pos, N, rope, acts, b.s()); });
}
template <class T>
void bind_kv_zigzag_reorder(Binder<T>& b, T* dst, const T* src, int64_t cp, int64_t block, bool to_gather) {
  cp = b.i("cp", cp), block = b.i("block", block);
  to_gather = b.flag("to_gather", to_gather);
  b.require(cp >= 1, "cp is 0");
  src = b.in("src", src, {2 * cp, block});
  dst = b.out("dst", dst, {2 * cp, block});
  b.call([&] { b.k().kv_zigzag_reorder(dst, src, cp, block, to_gather, b.s()); });
}
template <class T>
void bind_kv_zigzag_to_gather_acc(Binder<T>& b, ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block) {
  cp = b.i("cp", cp), block = b.i("block", block);
  b.require(cp >= 1, "cp is 0");
  x = b.acc_in("x", x, {2 * cp, block}, true);
  scratch = b.scratch_acc(scratch, block);
  b.call([&] { b.k().kv_zigzag_to_gather_acc(x, scratch, cp, block, b.s()); });
}
void bind_core_dims(auto& b, m::CoreDims& cd) {
  cd.H = b.i("H", cd.H), cd.G = b.i("G", cd.G), cd.Dq = b.i("Dq", cd.Dq), cd.Dv = b.i("Dv", cd.Dv);
  cd.P = b.i("P", cd.P), cd.val_base = b.i("val_base", cd.val_base);
  cd.scale = b.f("scale", cd.scale);
  b.require(cd.H >= 1 && cd.G >= 1 && cd.H % cd.G == 0, "H {} is not a multiple of G {} >= 1", cd.H, cd.G);
  b.require(cd.Dq >= 1 && cd.G * cd.Dq <= cd.P && cd.val_base + cd.G * cd.Dv <= cd.P,
            "the key ({} x {}) or value ({} + {} x {}) columns do not fit in the payload of {}", cd.G, cd.Dq,
            cd.val_base, cd.G, cd.Dv, cd.P);
}
// Query rows: positions in [0, S), document starts in [0, position].
template <class T>
void check_queries(Binder<T>& b, bool doc, int64_t S) {
  if (!b.replaying()) return;
  b.template in_range<int64_t>("qpos", 0, S);
  if (!doc) return;
  const std::vector<int64_t> pos = b.template values<int64_t>("qpos"), d = b.template values<int64_t>("qdoc");
  for (size_t r = 0; r < d.size() && r < pos.size(); ++r)
    b.require(d[r] >= 0 && d[r] <= pos[r], "input 'qdoc' element {} is {}, outside [0, {}]", r, d[r], pos[r]);
}
// The attention core and its document-mask variant (packed sequences: the extra input qdoc, each query's document
// start). One body: the plain op records exactly the inputs it always did.
template <class T, bool kDoc>
void bind_core_forward(Binder<T>& b, Policy pol, const m::CoreDims& cd_, const T* q, const int64_t* qpos,
                       const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  pol = b.pol(pol);
  m::CoreDims cd = cd_;
  bind_core_dims(b, cd);
  Nq = b.i("Nq", Nq), S = b.i("S", S);
  q = b.in("q", q, {Nq, cd.H * cd.Dq});
  qpos = b.in("qpos", qpos, {Nq});
  if constexpr (kDoc) qdoc = b.in("qdoc", qdoc, {Nq});
  check_queries(b, kDoc, S);
  kv = b.in("kv", kv, {S, cd.P});
  o = b.out("o", o, {Nq, cd.H * cd.Dv});
  stats = b.out("stats", stats, {Nq, cd.H * 2});
  b.call([&] {
    if constexpr (kDoc) b.k().attn_doc_core_forward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, b.s());
    else b.k().attn_core_forward(pol, cd, q, qpos, Nq, kv, S, o, stats, b.s());
  });
}
template <class T, bool kDoc>
void bind_core_backward(Binder<T>& b, Policy pol, const m::CoreDims& cd_, const T* q, const int64_t* qpos,
                        const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                        const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv) {
  pol = b.pol(pol);
  m::CoreDims cd = cd_;
  bind_core_dims(b, cd);
  Nq = b.i("Nq", Nq), S = b.i("S", S);
  qsegs = b.host("qsegs", qsegs);
  b.segments("qsegs", qsegs, Nq);
  q = b.in("q", q, {Nq, cd.H * cd.Dq});
  qpos = b.in("qpos", qpos, {Nq});
  if constexpr (kDoc) qdoc = b.in("qdoc", qdoc, {Nq});
  check_queries(b, kDoc, S);
  kv = b.in("kv", kv, {S, cd.P});
  o = b.in("o", o, {Nq, cd.H * cd.Dv});
  stats = b.in("stats", stats, {Nq, cd.H * 2});
  dO = b.in("dO", dO, {Nq, cd.H * cd.Dv});
  dq = b.out("dq", dq, {Nq, cd.H * cd.Dq});
  dkv = b.acc("dkv", dkv, {S, cd.P});
  b.call([&] {
    if constexpr (kDoc)
      b.k().attn_doc_core_backward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, b.s());
    else b.k().attn_core_backward(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, b.s());
  });
}
template <class T>
void bind_attn_core_forward(Binder<T>& b, Policy pol, const m::CoreDims& cd, const T* q, const int64_t* qpos,
                            int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  bind_core_forward<T, false>(b, pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats);
}
template <class T>
void bind_attn_core_backward(Binder<T>& b, Policy pol, const m::CoreDims& cd, const T* q, const int64_t* qpos,
                             int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                             T* dq, ExactAcc<T>* dkv) {
  bind_core_backward<T, false>(b, pol, cd, q, qpos, nullptr, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
}
template <class T>
void bind_attn_doc_core_forward(Binder<T>& b, Policy pol, const m::CoreDims& cd, const T* q, const int64_t* qpos,
                                const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, T* o, T* stats) {
  bind_core_forward<T, true>(b, pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
}
template <class T>
void bind_attn_doc_core_backward(Binder<T>& b, Policy pol, const m::CoreDims& cd, const T* q, const int64_t* qpos,
                                 const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats,
                                 const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv) {
  bind_core_backward<T, true>(b, pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
}
// DSA: the core's dims plus the indexer's.
void bind_dsa_dims(auto& b, m::CoreDims& cd) {
  bind_core_dims(b, cd);
  cd.Hi = b.i("Hi", cd.Hi), cd.Di = b.i("Di", cd.Di), cd.topk = b.i("topk", cd.topk), cd.ikey = b.i("ikey", cd.ikey);
  b.require(cd.topk >= 1 && cd.Hi >= 1 && cd.Di >= 1 && cd.ikey + cd.Di <= cd.P,
            "indexer dims Hi {} Di {} topk {} ikey {} do not fit the payload of {}", cd.Hi, cd.Di, cd.topk, cd.ikey,
            cd.P);
}
template <class T>
void bind_dsa_select(Binder<T>& b, Policy pol, const m::CoreDims& cd_, const T* iq, const int64_t* qpos,
                     const int64_t* qdoc, int64_t Nq, const T* kv, int64_t S, int32_t* sel) {
  pol = b.pol(pol);
  m::CoreDims cd = cd_;
  bind_dsa_dims(b, cd);
  Nq = b.i("Nq", Nq), S = b.i("S", S);
  iq = b.in("iq", iq, {Nq, cd.Hi * cd.Di + cd.Hi});
  qpos = b.in("qpos", qpos, {Nq});
  qdoc = b.opt_in("qdoc", qdoc, {Nq});
  check_queries(b, b.replaying() && !b.template values<int64_t>("qdoc").empty(), S);
  kv = b.in("kv", kv, {S, cd.P});
  sel = b.out("sel", sel, {Nq, cd.topk});
  b.call([&] { b.k().dsa_select(pol, cd, iq, qpos, qdoc, Nq, kv, S, sel, b.s()); });
}
template <class T>
void bind_dsa_core_forward(Binder<T>& b, Policy pol, const m::CoreDims& cd_, const T* q, const T* iq,
                           const int64_t* qpos, int64_t Nq, const T* kv, int64_t S, const int32_t* sel, T* o, T* stats,
                           T* ikl) {
  pol = b.pol(pol);
  m::CoreDims cd = cd_;
  bind_dsa_dims(b, cd);
  Nq = b.i("Nq", Nq), S = b.i("S", S);
  q = b.in("q", q, {Nq, cd.H * cd.Dq});
  iq = b.in("iq", iq, {Nq, cd.Hi * cd.Di + cd.Hi});
  qpos = b.in("qpos", qpos, {Nq});
  check_queries(b, false, S);
  kv = b.in("kv", kv, {S, cd.P});
  sel = b.in("sel", sel, {Nq, cd.topk});
  b.template in_range<int32_t>("sel", -1, S);
  o = b.out("o", o, {Nq, cd.H * cd.Dv});
  stats = b.out("stats", stats, {Nq, cd.H * 2});
  ikl = b.out("ikl", ikl, {Nq});
  b.call([&] { b.k().dsa_core_forward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, ikl, b.s()); });
}
template <class T>
void bind_dsa_core_backward(Binder<T>& b, Policy pol, const m::CoreDims& cd_, const T* q, const T* iq,
                            const int64_t* qpos, int64_t Nq, const T* kv, int64_t S, const int32_t* sel, const T* o,
                            const T* stats, const T* dO, T iscale, Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv) {
  pol = b.pol(pol);
  m::CoreDims cd = cd_;
  bind_dsa_dims(b, cd);
  Nq = b.i("Nq", Nq), S = b.i("S", S);
  iscale = static_cast<T>(b.f("iscale", static_cast<double>(iscale)));
  qsegs = b.host("qsegs", qsegs);
  b.segments("qsegs", qsegs, Nq);
  q = b.in("q", q, {Nq, cd.H * cd.Dq});
  iq = b.in("iq", iq, {Nq, cd.Hi * cd.Di + cd.Hi});
  qpos = b.in("qpos", qpos, {Nq});
  check_queries(b, false, S);
  kv = b.in("kv", kv, {S, cd.P});
  sel = b.in("sel", sel, {Nq, cd.topk});
  b.template in_range<int32_t>("sel", -1, S);
  o = b.in("o", o, {Nq, cd.H * cd.Dv});
  stats = b.in("stats", stats, {Nq, cd.H * 2});
  dO = b.in("dO", dO, {Nq, cd.H * cd.Dv});
  dq = b.out("dq", dq, {Nq, cd.H * cd.Dq});
  diq = b.out("diq", diq, {Nq, cd.Hi * cd.Di + cd.Hi});
  dkv = b.acc("dkv", dkv, {S, cd.P});
  b.call([&] {
    b.k().dsa_core_backward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, qsegs, dq, diq, dkv, b.s());
  });
}
template <class T>
void bind_attn_out_forward(Binder<T>& b, Policy pol, const m::Config& cfg_, const m::AttnW<T>& W_, int64_t N,
                           const m::AttnBufs<T>& acts_, T* y) {
  pol = b.pol(pol);
  const m::Config& cfg = b.config(cfg_);
  N = b.i("N", N);
  const m::AttnW<T> W = bind_w(b, cfg, W_);
  const m::AttnBufs<T> acts = bind_acts(b, cfg, N, acts_, "-----i-o");
  y = b.out("y", y, {N, cfg.d_model});
  b.call([&] { b.k().attn_out_forward(pol, cfg, W, N, acts, y, b.s()); });
}
template <class T>
void bind_attn_out_backward(Binder<T>& b, Policy pol, const m::Config& cfg_, const m::AttnW<T>& W_,
                            const m::AttnG<T>& G_, int64_t N, const m::AttnBufs<T>& acts_, const T* dy, Segs segs,
                            T* dO) {
  pol = b.pol(pol);
  const m::Config& cfg = b.config(cfg_);
  N = b.i("N", N);
  segs = b.host("segs", segs);
  b.segments("segs", segs, N);
  const m::AttnW<T> W = bind_w(b, cfg, W_);
  const m::AttnBufs<T> acts = bind_acts(b, cfg, N, acts_, "-----i-i");
  dy = b.in("dy", dy, {N, cfg.d_model});
  dO = b.out("dO", dO, {m::AttnActSizes::of(cfg, N).o});
  const m::AttnG<T> G = bind_g(b, cfg, G_, {"wo", "wuv"});
  b.call([&] { b.k().attn_out_backward(pol, cfg, W, G, N, acts, dy, segs, dO, b.s()); });
}
template <class T>
void bind_attn_qkv_backward(Binder<T>& b, Policy pol, const m::Config& cfg_, const m::AttnW<T>& W_,
                            const m::AttnG<T>& G_, const T* a, const int64_t* pos, int64_t N,
                            const m::RopeTable<T>& rope_, const m::AttnBufs<T>& acts_, const T* dqc,
                            const T* dpayload, Segs segs, T* da) {
  pol = b.pol(pol);
  const m::Config& cfg = b.config(cfg_);
  N = b.i("N", N);
  segs = b.host("segs", segs);
  b.segments("segs", segs, N);
  const m::RopeTable<T>& rope = b.rope(rope_);
  b.require(rope.D == cfg.rope_width(), "rope width {}, the config's is {}", rope.D, cfg.rope_width());
  const m::AttnActSizes z = m::AttnActSizes::of(cfg, N);
  a = b.in("a", a, {N, cfg.d_model});
  pos = b.in("pos", pos, {N});
  b.template in_range<int64_t>("pos", 0, rope.max_pos);
  const m::AttnW<T> W = bind_w(b, cfg, W_);
  const m::AttnBufs<T> acts = bind_acts(b, cfg, N, acts_, "iiiii---");
  dqc = b.in("dqc", dqc, {z.qc});
  dpayload = b.in("dpayload", dpayload, {z.payload});
  da = b.out("da", da, {N, cfg.d_model});
  const m::AttnG<T> G = bind_g(b, cfg, G_, {"wq", "wk", "wv", "wdkv", "kv_norm", "wuk"});
  b.call([&] { b.k().attn_qkv_backward(pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da, b.s()); });
}
template <class T>
void bind_linear_ce_forward(Binder<T>& b, Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N,
                            int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse) {
  pol = b.pol(pol);
  N = b.i("N", N), d = b.i("d", d), V = b.i("V", V);
  vocab_chunk = b.i("vocab_chunk", vocab_chunk), token_chunk = b.i("token_chunk", token_chunk);
  b.require(vocab_chunk >= 1 && token_chunk >= 1, "vocab_chunk {} or token_chunk {} is 0", vocab_chunk, token_chunk);
  hidden = b.in("hidden", hidden, {N, d});
  W = b.in("W", W, {d, V});
  targets = b.in("targets", targets, {N});
  b.template in_range<int32_t>("targets", 0, V, -100);
  token_loss = b.out("token_loss", token_loss, {N});
  lse = b.out("lse", lse, {N});
  b.call([&] {
    b.k().linear_ce_forward(pol, hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse, b.s());
  });
}
template <class T>
void bind_linear_ce_backward(Binder<T>& b, Policy pol, const T* hidden, const T* W, const int32_t* targets,
                             const T* lse, int64_t N, int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk,
                             T grad_scale, Segs segs, int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW) {
  pol = b.pol(pol);
  N = b.i("N", N), d = b.i("d", d), V = b.i("V", V);
  vocab_chunk = b.i("vocab_chunk", vocab_chunk), token_chunk = b.i("token_chunk", token_chunk);
  grad_scale = static_cast<T>(b.f("grad_scale", static_cast<double>(grad_scale)));
  j_begin = b.i("j_begin", j_begin), j_end = b.i("j_end", j_end);
  segs = b.host("segs", segs);
  b.segments("segs", segs, N);
  b.require(vocab_chunk >= 1 && token_chunk >= 1, "vocab_chunk {} or token_chunk {} is 0", vocab_chunk, token_chunk);
  b.require(j_begin <= j_end && j_end <= V, "columns [{}, {}) outside [0, V = {})", j_begin, j_end, V);
  hidden = b.in("hidden", hidden, {N, d});
  W = b.in("W", W, {d, V});
  targets = b.in("targets", targets, {N});
  b.template in_range<int32_t>("targets", 0, V, -100);
  lse = b.in("lse", lse, {N});
  dhidden = b.inout("dhidden", dhidden, {N, d});
  dW = b.acc("dW", dW, {d, j_end - j_begin});
  b.call([&] {
    b.k().linear_ce_backward(pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale, segs,
                             j_begin, j_end, dhidden, dW, b.s());
  });
}
template <class T>
void bind_grad_sq_acc(Binder<T>& b, const T* g, int64_t n, ExactAcc<double>* acc) {
  n = b.i("n", n);
  g = b.in("g", g, {n});
  acc = b.acc_f64("sq", acc);
  b.call([&] { b.k().grad_sq_acc(g, n, acc, b.s()); });
}
template <class T>
void bind_adamw_step(Binder<T>& b, T* w, const T* g, T* mo, T* v, int64_t n, const m::AdamWHyper& hyper_,
                     int64_t step, double clip, bool decay) {
  n = b.i("n", n);
  m::AdamWHyper hyper = hyper_;
  hyper.lr = b.f("lr", hyper.lr), hyper.beta1 = b.f("beta1", hyper.beta1), hyper.beta2 = b.f("beta2", hyper.beta2);
  hyper.eps = b.f("eps", hyper.eps), hyper.weight_decay = b.f("weight_decay", hyper.weight_decay);
  hyper.max_grad_norm = b.f("max_grad_norm", hyper.max_grad_norm);
  step = b.i("step", step);
  clip = b.f("clip", clip);
  decay = b.flag("decay", decay);
  b.require(step >= 1, "step {} < 1", step);
  g = b.in("g", g, {n});
  w = b.inout("w", w, {n});
  mo = b.inout("m", mo, {n});
  v = b.inout("v", v, {n});
  b.call([&] { b.k().adamw_step(w, g, mo, v, n, hyper, step, clip, decay, b.s()); });
}
template <class T>
void bind_router_bias_update(Binder<T>& b, T* bias, const int64_t* load, int64_t E, double gamma) {
  E = b.i("E", E);
  gamma = b.f("gamma", gamma);
  load = b.in("load", load, {E});
  b.template in_range<int64_t>("load", 0, std::numeric_limits<int64_t>::max());
  bias = b.inout("b", bias, {E});
  b.call([&] { b.k().router_bias_update(bias, load, E, gamma, b.s()); });
}

// Any value: stands for every argument of a bind function in replay, where the binder supplies them.
struct Any {
  template <class U>
  operator U() const {
    return U{};
  }
};

// ---- the op table ----------------------------------------------------------------------------------------------
template <class T>
struct OpEntry {
  OpEntry() = default;
  OpEntry(std::function<void(Binder<T>&)> r, std::string out = {}, std::string prim = {}, std::string dir = {},
          std::function<int64_t(const PrimCase&)> nt = {})
      : replay(std::move(r)), bound_output(std::move(out)), primitive(std::move(prim)), direction(std::move(dir)),
        n_terms(std::move(nt)) {}
  std::function<void(Binder<T>&)> replay;
  // Error-bound data (multilinear ops): the output, the tolerance-table primitive and direction, n_terms.
  std::string bound_output, primitive, direction;
  std::function<int64_t(const PrimCase&)> n_terms;
};

int64_t case_i(const PrimCase& c, const char* k) { return c.shapes.at(k).get<int64_t>(); }
int64_t case_longest_tile(const PrimCase& c, const char* name) {
  for (const NamedTensor& t : c.inputs)
    if (t.name == name) {
      std::vector<int64_t> v(static_cast<size_t>(t.numel()));
      if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
      return longest_tile(v);
    }
  return 0;
}

template <class T>
const std::map<std::string, OpEntry<T>>& op_table() {
  static const std::map<std::string, OpEntry<T>> table = [] {
    std::map<std::string, OpEntry<T>> t;
    Any z;
    t["mm"] = OpEntry<T>{[z](Binder<T>& b) { bind_mm<T>(b, z, z, z, z, z, z, z, z, z, z, z); }, "C", "gemm", "vs_fp64",
               [](const PrimCase& c) { return case_i(c, "K"); }};
    t["wgrad_acc"] = OpEntry<T>{[z](Binder<T>& b) { bind_wgrad_acc<T>(b, z, z, z, z, z, z, z, z, z); }, "acc", "tile_wgrad",
                      "vs_fp64", [](const PrimCase& c) { return case_longest_tile(c, "segs"); }};
    t["sum_acc"] = OpEntry<T>{[z](Binder<T>& b) { bind_sum_acc<T>(b, z, z, z, z); }, "acc", "tile_sum", "vs_fp64",
                    [](const PrimCase& c) { return case_longest_tile(c, "segs"); }};
    t["exact_round"] = OpEntry<T>{[z](Binder<T>& b) { bind_exact_round<T>(b, z, z, z); }, "out", "exact_acc", "vs_exact",
                        [](const PrimCase&) { return int64_t{0}; }};
    t["embedding_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_embedding_forward<T>(b, z, z, z, z, z, z); }};
    t["embedding_backward"] = OpEntry<T>{[z](Binder<T>& b) { bind_embedding_backward<T>(b, z, z, z, z, z, z, z); }, "dembed",
                               "tile_sum", "vs_fp64",
                               [](const PrimCase& c) { return case_longest_tile(c, "segs"); }};
    t["rmsnorm_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_rmsnorm_forward<T>(b, z, z, z, z, z, z, z, z, z); }};
    t["rmsnorm_backward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_rmsnorm_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["residual_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_residual_forward<T>(b, z, z, z, z); }};
    t["swiglu_forward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_swiglu_forward<T, false>(b, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["swiglu_backward_dgrad"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_swiglu_dgrad<T, false>(b, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["expert_forward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_swiglu_forward<T, true>(b, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["expert_backward_dgrad"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_swiglu_dgrad<T, true>(b, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["router_forward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_router_forward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["router_backward"] = OpEntry<T>{[z](Binder<T>& b) { bind_router_backward<T>(b, z, z, z, z, z, z, z, z); }};
    t["moe_combine_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_moe_combine_forward<T>(b, z, z, z, z, z, z); }};
    t["moe_combine_backward"] = OpEntry<T>{[z](Binder<T>& b) { bind_moe_combine_backward<T>(b, z, z, z, z, z, z, z, z); }};
    t["moe_dx_sum"] = OpEntry<T>{[z](Binder<T>& b) { bind_moe_dx_sum<T>(b, z, z, z, z, z); }};
    t["gather_rows"] = OpEntry<T>{[z](Binder<T>& b) { bind_gather_rows<T>(b, z, z, z, z); }};
    t["scatter_rows"] = OpEntry<T>{[z](Binder<T>& b) { bind_scatter_rows<T>(b, z, z, z, z); }};
    t["attn_qkv_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_attn_qkv_forward<T>(b, z, z, z, z, z, z, z, z); }};
    t["kv_zigzag_reorder"] = OpEntry<T>{[z](Binder<T>& b) { bind_kv_zigzag_reorder<T>(b, z, z, z, z, z); }};
    t["kv_zigzag_to_gather_acc"] = OpEntry<T>{[z](Binder<T>& b) { bind_kv_zigzag_to_gather_acc<T>(b, z, z, z, z); }};
    t["attn_core_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_attn_core_forward<T>(b, z, z, z, z, z, z, z, z, z); }};
    t["attn_core_backward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_attn_core_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["attn_doc_core_forward"] =
        OpEntry<T>{[z](Binder<T>& b) { bind_attn_doc_core_forward<T>(b, z, z, z, z, z, z, z, z, z, z); }};
    t["attn_doc_core_backward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_attn_doc_core_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["dsa_select"] = OpEntry<T>{[z](Binder<T>& b) { bind_dsa_select<T>(b, z, z, z, z, z, z, z, z, z); }};
    t["dsa_core_forward"] =
        OpEntry<T>{[z](Binder<T>& b) { bind_dsa_core_forward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["dsa_core_backward"] = OpEntry<T>{[z](Binder<T>& b) {
      bind_dsa_core_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    }};
    t["attn_out_forward"] = OpEntry<T>{[z](Binder<T>& b) { bind_attn_out_forward<T>(b, z, z, z, z, z, z); }};
    t["attn_out_backward"] = OpEntry<T>{[z](Binder<T>& b) { bind_attn_out_backward<T>(b, z, z, z, z, z, z, z, z, z); }};
    t["attn_qkv_backward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_attn_qkv_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z); }};
    t["linear_ce_forward"] = OpEntry<T>{
        [z](Binder<T>& b) { bind_linear_ce_forward<T>(b, z, z, z, z, z, z, z, z, z, z, z); }};
    t["linear_ce_backward"] = OpEntry<T>{[z](Binder<T>& b) {
      bind_linear_ce_backward<T>(b, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    }};
    t["grad_sq_acc"] = OpEntry<T>{[z](Binder<T>& b) { bind_grad_sq_acc<T>(b, z, z, z); }};
    t["adamw_step"] = OpEntry<T>{[z](Binder<T>& b) { bind_adamw_step<T>(b, z, z, z, z, z, z, z, z, z); }};
    t["router_bias_update"] = OpEntry<T>{[z](Binder<T>& b) { bind_router_bias_update<T>(b, z, z, z, z); }};
    return t;
  }();
  return table;
}

// Replays case c through its op's binder b, then checks that a policy is stored only on an op that takes one.
template <class T>
void replay_checked(const OpEntry<T>& op, Binder<T>& b, const PrimCase& c) {
  op.replay(b);
  if (!b.uses_policy() && !c.policy.empty())
    fail(fmt::format("primitive case {}/{} (rank {}): policy '{}' on an op without one (the file is corrupt)", c.op,
                     c.name, c.rank, c.policy.substr(0, 64)));
}

template <class T>
std::vector<NamedTensor> replay(const PrimCase& c, Kernels<T>& k, Device& dev, bool abs_inputs,
                                bool expect_outputs = false) {
  const auto& table = op_table<T>();
  auto it = table.find(c.op);
  if (it == table.end()) fail(fmt::format("primitive case {}/{}: unknown op '{}'", c.op, c.name, c.op));
  if (c.dtype != detail::dtype_of<T>())
    fail(fmt::format("primitive case {}/{}: dtype {} run with a {} kernel set", c.op, c.name, c.dtype,
                     detail::dtype_of<T>()));
  PrimCase& cc = const_cast<PrimCase&>(c);  // replay only reads it
  Binder<T> b(Mode::replay, dev, dev.compute_stream(), cc, &k);
  b.abs_inputs = abs_inputs;
  b.expect_outputs = expect_outputs;
  replay_checked(it->second, b, c);
  return std::move(b.results);
}

template <class T>
struct Scratch {
  RankTrace trace;
  emu::EmuDevice dev{0, trace, emu::DeviceOptions{.record_trace = false}};
  CpuKernels<T> k{dev};
};

// Fills outputs, sum_abs, n_terms and tolerance of a captured case (replay with the reference kernels).
template <class T>
void complete_case(PrimCase& c) {
  Scratch<T> s;
  c.outputs = replay<T>(c, s.k, s.dev, false);
  complete_accept(c);
  const OpEntry<T>& e = op_table<T>().at(c.op);
  if (e.primitive.empty()) return;
  const std::string dt = c.policy.empty() ? (c.dtype == "f64" ? "fp64" : "fp32") : c.policy;
  bool has_entry = false;
  for (const Tolerance& t : kTolerances)
    has_entry |= t.primitive == e.primitive && t.dtype == dt && t.direction == e.direction;
  if (!has_entry) return;  // no table entry (e.g. bf16 operand rounding): bits only
  const Tolerance& tol = tolerance(e.primitive, dt, e.direction);
  for (NamedTensor& a : replay<T>(c, s.k, s.dev, true)) {
    if (a.name != e.bound_output) continue;
    T* p = reinterpret_cast<T*>(a.bytes.data());
    for (int64_t i = 0; i < a.numel(); ++i) p[i] = std::fabs(p[i]);
    c.sum_abs.push_back(std::move(a));
  }
  c.n_terms[e.bound_output] = e.n_terms(c);
  c.tolerance[e.bound_output] = {{"primitive", e.primitive}, {"dtype", dt},          {"direction", e.direction},
                                 {"k_const", tol.k_const},  {"k_per_term", tol.k_per_term}, {"u", unit_roundoff(dt)}};
}

// ---- the recording kernel set -----------------------------------------------------------------------------------
template <class T>
class RecordingKernels final : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnBufs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  using typename Kernels<T>::loc_t;
  RecordingKernels(std::unique_ptr<Kernels<T>> inner, Device& dev, int rank, Recorder& rec)
      : in_(std::move(inner)), dev_(dev), rank_(rank), rec_(rec) {}

#define TD_REC(OP, ...)                                                                          \
  record(#OP, s, [&](Binder<T>& b) { bind_##OP<T>(b, __VA_ARGS__); })
  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc, Stream s, loc_t loc) override {
    TD_REC(mm, pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc);
    in_->mm(pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc, s, loc);
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc) override {
    TD_REC(wgrad_acc, pol, X, ldx, dY, ldy, K, M, segs, acc);
    in_->wgrad_acc(pol, X, ldx, dY, ldy, K, M, segs, acc, s, loc);
  }
  void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc) override {
    TD_REC(sum_acc, x, J, segs, acc);
    in_->sum_acc(x, J, segs, acc, s, loc);
  }
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc) override {
    TD_REC(exact_round, acc, out, n);
    in_->exact_round(acc, out, n, s, loc);
  }
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V, Stream s,
                         loc_t loc) override {
    TD_REC(embedding_forward, out, tokens, embed, N, d, V);
    in_->embedding_forward(out, tokens, embed, N, d, V, s, loc);
  }
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, Segs segs,
                          Stream s, loc_t loc) override {
    // The accumulator's row count is not an argument: the largest slot + 1.
    int64_t rows = 0;
    if (N > 0) {
      std::vector<int32_t> t(static_cast<size_t>(N));
      dev_.download(t.data(), tokens, N * static_cast<int64_t>(sizeof(int32_t)), s);
      dev_.synchronize(s);
      for (int32_t x : t) rows = std::max<int64_t>(rows, int64_t{x} + 1);
    }
    TD_REC(embedding_backward, dembed, tokens, dout, N, d, segs, rows);
    in_->embedding_backward(dembed, tokens, dout, N, d, segs, s, loc);
  }
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv, Stream s, loc_t loc) override {
    TD_REC(rmsnorm_forward, x, ldx, g, N, d, eps, y, ldy, rinv);
    in_->rmsnorm_forward(x, ldx, g, N, d, eps, y, ldy, rinv, s, loc);
  }
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                        int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s, loc_t loc) override {
    TD_REC(rmsnorm_backward, dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg);
    in_->rmsnorm_backward(dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg, s, loc);
  }
  void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc) override {
    record("residual_forward", s, [&](Binder<T>& bb) { bind_residual_forward<T>(bb, out, a, b, n); });
    in_->residual_forward(out, a, b, n, s, loc);
  }
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) override {
    record("swiglu_forward", s,
           [&](Binder<T>& b) { bind_swiglu_forward<T, false>(b, pol, x, wg, wu, wd, N, d, F, ug, uu, h, y); });
    in_->swiglu_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
  }
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) override {
    record("swiglu_backward_dgrad", s, [&](Binder<T>& b) {
      bind_swiglu_dgrad<T, false>(b, pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx);
    });
    in_->swiglu_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
  }
  void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) override {
    record("expert_forward", s,
           [&](Binder<T>& b) { bind_swiglu_forward<T, true>(b, pol, x, wg, wu, wd, N, d, F, ug, uu, h, y); });
    in_->expert_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
  }
  void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) override {
    record("expert_backward_dgrad", s, [&](Binder<T>& b) {
      bind_swiglu_dgrad<T, true>(b, pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx);
    });
    in_->expert_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
  }
  void on_moe_combined(int64_t layer, const T* a, const T* gates, const int32_t* sel, const T* routed, int64_t N,
                       int64_t d, int64_t K, Stream s, loc_t loc) override {
    in_->on_moe_combined(layer, a, gates, sel, routed, N, d, K, s, loc);
  }
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                      double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s, loc_t loc) override {
    TD_REC(router_forward, pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates);
    in_->router_forward(pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates, s, loc);
  }
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                       double alpha, T* dlogits, Stream s, loc_t loc) override {
    TD_REC(router_backward, dgates, scores, sel, N, E, K, alpha, dlogits);
    in_->router_backward(dgates, scores, sel, N, E, K, alpha, dlogits, s, loc);
  }
  void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s,
                           loc_t loc) override {
    TD_REC(moe_combine_forward, out, gates, yk, N, d, K);
    in_->moe_combine_forward(out, gates, yk, N, d, K, s, loc);
  }
  void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                            int64_t K, T* dgates, T* dyk, Stream s, loc_t loc) override {
    TD_REC(moe_combine_backward, dout, gates, yk, tk, d, K, dgates, dyk);
    in_->moe_combine_backward(dout, gates, yk, tk, d, K, dgates, dyk, s, loc);
  }
  void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s, loc_t loc) override {
    TD_REC(moe_dx_sum, dx, dxk, N, d, K);
    in_->moe_dx_sum(dx, dxk, N, d, K, s, loc);
  }
  void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) override {
    TD_REC(gather_rows, dst, src, idx, w);
    in_->gather_rows(dst, src, idx, w, s, loc);
  }
  void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) override {
    TD_REC(scatter_rows, dst, src, idx, w);
    in_->scatter_rows(dst, src, idx, w, s, loc);
  }
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc) override {
    TD_REC(attn_qkv_forward, pol, cfg, W, a, pos, N, rope, acts);
    in_->attn_qkv_forward(pol, cfg, W, a, pos, N, rope, acts, s, loc);
  }
  void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                         loc_t loc) override {
    TD_REC(kv_zigzag_reorder, dst, src, cp, block, to_gather);
    in_->kv_zigzag_reorder(dst, src, cp, block, to_gather, s, loc);
  }
  void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s,
                               loc_t loc) override {
    TD_REC(kv_zigzag_to_gather_acc, x, scratch, cp, block);
    in_->kv_zigzag_to_gather_acc(x, scratch, cp, block, s, loc);
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc) override {
    TD_REC(attn_core_forward, pol, cd, q, qpos, Nq, kv, S, o, stats);
    in_->attn_core_forward(pol, cd, q, qpos, Nq, kv, S, o, stats, s, loc);
  }
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc) override {
    TD_REC(attn_core_backward, pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
    in_->attn_core_backward(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, s, loc);
  }
  void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                             int64_t Nq, const T* kv, int64_t S, T* o, T* stats, Stream s, loc_t loc) override {
    TD_REC(attn_doc_core_forward, pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats);
    in_->attn_doc_core_forward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, s, loc);
  }
  void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc) override {
    TD_REC(dsa_select, pol, cd, iq, qpos, qdoc, Nq, kv, S, sel);
    in_->dsa_select(pol, cd, iq, qpos, qdoc, Nq, kv, S, sel, s, loc);
  }
  void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                        const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl, Stream s,
                        loc_t loc) override {
    TD_REC(dsa_core_forward, pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, ikl);
    in_->dsa_core_forward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, ikl, s, loc);
  }
  void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                         const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                         Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv, Stream s, loc_t loc) override {
    TD_REC(dsa_core_backward, pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, qsegs, dq, diq, dkv);
    in_->dsa_core_backward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, qsegs, dq, diq, dkv, s, loc);
  }
  void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                              T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc) override {
    TD_REC(attn_doc_core_backward, pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv);
    in_->attn_doc_core_backward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, s, loc);
  }
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y, Stream s,
                        loc_t loc) override {
    TD_REC(attn_out_forward, pol, cfg, W, N, acts, y);
    in_->attn_out_forward(pol, cfg, W, N, acts, y, s, loc);
  }
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                         const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s, loc_t loc) override {
    TD_REC(attn_out_backward, pol, cfg, W, G, N, acts, dy, segs, dO);
    in_->attn_out_backward(pol, cfg, W, G, N, acts, dy, segs, dO, s, loc);
  }
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                         const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc,
                         const T* dpayload, Segs segs, T* da, Stream s, loc_t loc) override {
    TD_REC(attn_qkv_backward, pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da);
    in_->attn_qkv_backward(pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da, s, loc);
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc) override {
    TD_REC(linear_ce_forward, pol, hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse);
    in_->linear_ce_forward(pol, hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse, s, loc);
  }
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s, loc_t loc) override {
    TD_REC(linear_ce_backward, pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale, segs,
           j_begin, j_end, dhidden, dW);
    in_->linear_ce_backward(pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale, segs, j_begin,
                            j_end, dhidden, dW, s, loc);
  }
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc) override {
    TD_REC(grad_sq_acc, g, n, acc);
    in_->grad_sq_acc(g, n, acc, s, loc);
  }
  void adamw_step(T* w, const T* g, T* mo, T* v, int64_t n, const m::AdamWHyper& hyper, int64_t step, double clip,
                  bool decay, Stream s, loc_t loc) override {
    TD_REC(adamw_step, w, g, mo, v, n, hyper, step, clip, decay);
    in_->adamw_step(w, g, mo, v, n, hyper, step, clip, decay, s, loc);
  }
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s, loc_t loc) override {
    record("router_bias_update", s, [&](Binder<T>& bb) { bind_router_bias_update<T>(bb, b, load, E, gamma); });
    in_->router_bias_update(b, load, E, gamma, s, loc);
  }
#undef TD_REC

 private:
  template <class F>
  void record(const char* op, Stream s, F&& bind) {
    PrimCase dry;
    dry.op = op;
    {
      Binder<T> b(Mode::dry, dev_, s, dry);
      bind(b);
    }
    std::string name;
    if (!rec_.claim(rank_, op, dry.policy + dry.shapes.dump(), name)) return;
    PrimCase c;
    c.op = op;
    c.name = name;
    c.rank = rank_;
    c.dtype = detail::dtype_of<T>();
    {
      Binder<T> b(Mode::capture, dev_, s, c);
      bind(b);
    }
    complete_case<T>(c);
    c.repro = fmt::format("{} --op {} --case {}{}", rec_.repro_base(), c.op, c.name,
                          rank_ > 0 ? fmt::format(" --rank {}", rank_) : std::string());
    rec_.add(std::move(c));
  }

  std::unique_ptr<Kernels<T>> in_;
  Device& dev_;
  int rank_;
  Recorder& rec_;
};

// ---- the perturbed kernel set: the first output of one op gets one ulp flipped at one element ------------------
PerturbStats perturb_stats_;

template <class T>
class PerturbedKernels final : public Kernels<T> {
 public:
  using typename Kernels<T>::Config;
  using typename Kernels<T>::AttnW;
  using typename Kernels<T>::AttnG;
  using typename Kernels<T>::AttnBufs;
  using typename Kernels<T>::CoreDims;
  using typename Kernels<T>::Rope;
  using typename Kernels<T>::loc_t;
  PerturbedKernels(std::unique_ptr<Kernels<T>> inner, Device& dev, std::string op, int64_t index)
      : in_(std::move(inner)), dev_(dev), op_(std::move(op)), index_(index) {}

  void mm(Policy pol, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, bool trans_b,
          T* C, int64_t ldc, Stream s, loc_t loc) override {
    in_->mm(pol, M, N, K, A, lda, B, ldb, trans_b, C, ldc, s, loc);
    flip("mm", C, M * ldc, s);
  }
  void wgrad_acc(Policy pol, const T* X, int64_t ldx, const T* dY, int64_t ldy, int64_t K, int64_t M, Segs segs,
                 ExactAcc<T>* acc, Stream s, loc_t loc) override {
    in_->wgrad_acc(pol, X, ldx, dY, ldy, K, M, segs, acc, s, loc);
  }
  void sum_acc(const T* x, int64_t J, Segs segs, ExactAcc<T>* acc, Stream s, loc_t loc) override {
    in_->sum_acc(x, J, segs, acc, s, loc);
  }
  void exact_round(const ExactAcc<T>* acc, T* out, int64_t n, Stream s, loc_t loc) override {
    in_->exact_round(acc, out, n, s, loc);
    flip("exact_round", out, n, s);
  }
  void embedding_forward(T* out, const int32_t* tokens, const T* embed, int64_t N, int64_t d, int64_t V, Stream s,
                         loc_t loc) override {
    in_->embedding_forward(out, tokens, embed, N, d, V, s, loc);
    flip("embedding_forward", out, N * d, s);
  }
  void embedding_backward(ExactAcc<T>* dembed, const int32_t* tokens, const T* dout, int64_t N, int64_t d, Segs segs,
                          Stream s, loc_t loc) override {
    in_->embedding_backward(dembed, tokens, dout, N, d, segs, s, loc);
  }
  void rmsnorm_forward(const T* x, int64_t ldx, const T* g, int64_t N, int64_t d, double eps, T* y, int64_t ldy,
                       T* rinv, Stream s, loc_t loc) override {
    in_->rmsnorm_forward(x, ldx, g, N, d, eps, y, ldy, rinv, s, loc);
    flip("rmsnorm_forward", y, N * ldy, s);
  }
  void rmsnorm_backward(const T* dy, int64_t lddy, const T* x, int64_t ldx, const T* rinv, const T* g, int64_t N,
                        int64_t d, Segs segs, T* dx, int64_t lddx, ExactAcc<T>* dg, Stream s, loc_t loc) override {
    in_->rmsnorm_backward(dy, lddy, x, ldx, rinv, g, N, d, segs, dx, lddx, dg, s, loc);
    flip("rmsnorm_backward", dx, N * lddx, s);
  }
  void residual_forward(T* out, const T* a, const T* b, int64_t n, Stream s, loc_t loc) override {
    in_->residual_forward(out, a, b, n, s, loc);
    flip("residual_forward", out, n, s);
  }
  void swiglu_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) override {
    in_->swiglu_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
    flip("swiglu_forward", ug, N * F, s);
  }
  void swiglu_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) override {
    in_->swiglu_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
    flip("swiglu_backward_dgrad", dug, N * F, s);
  }
  void expert_forward(Policy pol, const T* x, const T* wg, const T* wu, const T* wd, int64_t N, int64_t d, int64_t F,
                      T* ug, T* uu, T* h, T* y, Stream s, loc_t loc) override {
    in_->expert_forward(pol, x, wg, wu, wd, N, d, F, ug, uu, h, y, s, loc);
    flip("expert_forward", ug, N * F, s);
  }
  void expert_backward_dgrad(Policy pol, const T* dy, const T* wg, const T* wu, const T* wd, const T* ug, const T* uu,
                             int64_t N, int64_t d, int64_t F, T* dug, T* duu, T* dx, Stream s, loc_t loc) override {
    in_->expert_backward_dgrad(pol, dy, wg, wu, wd, ug, uu, N, d, F, dug, duu, dx, s, loc);
    flip("expert_backward_dgrad", dug, N * F, s);
  }
  void on_moe_combined(int64_t layer, const T* a, const T* gates, const int32_t* sel, const T* routed, int64_t N,
                       int64_t d, int64_t K, Stream s, loc_t loc) override {
    in_->on_moe_combined(layer, a, gates, sel, routed, N, d, K, s, loc);
  }
  void router_forward(Policy pol, const T* a, const T* wr, const T* bias, int64_t N, int64_t d, int64_t E, int64_t K,
                      double alpha, T* logits, T* scores, int32_t* sel, T* gates, Stream s, loc_t loc) override {
    in_->router_forward(pol, a, wr, bias, N, d, E, K, alpha, logits, scores, sel, gates, s, loc);
    flip("router_forward", logits, N * E, s);
  }
  void router_backward(const T* dgates, const T* scores, const int32_t* sel, int64_t N, int64_t E, int64_t K,
                       double alpha, T* dlogits, Stream s, loc_t loc) override {
    in_->router_backward(dgates, scores, sel, N, E, K, alpha, dlogits, s, loc);
    flip("router_backward", dlogits, N * E, s);
  }
  void moe_combine_forward(T* out, const T* gates, const T* yk, int64_t N, int64_t d, int64_t K, Stream s,
                           loc_t loc) override {
    in_->moe_combine_forward(out, gates, yk, N, d, K, s, loc);
    flip("moe_combine_forward", out, N * d, s);
  }
  void moe_combine_backward(const T* dout, const T* gates, const T* yk, std::span<const int64_t> tk, int64_t d,
                            int64_t K, T* dgates, T* dyk, Stream s, loc_t loc) override {
    in_->moe_combine_backward(dout, gates, yk, tk, d, K, dgates, dyk, s, loc);
    flip("moe_combine_backward", dyk, static_cast<int64_t>(tk.size()) * d, s);
  }
  void moe_dx_sum(T* dx, const T* dxk, int64_t N, int64_t d, int64_t K, Stream s, loc_t loc) override {
    in_->moe_dx_sum(dx, dxk, N, d, K, s, loc);
    flip("moe_dx_sum", dx, N * d, s);
  }
  void gather_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) override {
    in_->gather_rows(dst, src, idx, w, s, loc);
    flip("gather_rows", dst, static_cast<int64_t>(idx.size()) * w, s);
  }
  void scatter_rows(T* dst, const T* src, std::span<const int64_t> idx, int64_t w, Stream s, loc_t loc) override {
    in_->scatter_rows(dst, src, idx, w, s, loc);
  }
  void attn_qkv_forward(Policy pol, const Config& cfg, const AttnW& W, const T* a, const int64_t* pos, int64_t N,
                        const Rope& rope, const AttnBufs& acts, Stream s, loc_t loc) override {
    in_->attn_qkv_forward(pol, cfg, W, a, pos, N, rope, acts, s, loc);
    flip("attn_qkv_forward", acts.qc, m::AttnActSizes::of(cfg, N).qc, s);
  }
  void kv_zigzag_reorder(T* dst, const T* src, int64_t cp, int64_t block, bool to_gather, Stream s,
                         loc_t loc) override {
    in_->kv_zigzag_reorder(dst, src, cp, block, to_gather, s, loc);
    flip("kv_zigzag_reorder", dst, 2 * cp * block, s);
  }
  void kv_zigzag_to_gather_acc(ExactAcc<T>* x, ExactAcc<T>* scratch, int64_t cp, int64_t block, Stream s,
                               loc_t loc) override {
    in_->kv_zigzag_to_gather_acc(x, scratch, cp, block, s, loc);
  }
  void attn_doc_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                             int64_t Nq, const T* kv, int64_t S, T* o, T* stats, Stream s, loc_t loc) override {
    in_->attn_doc_core_forward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, s, loc);
    flip("attn_doc_core_forward", o, Nq * cd.H * cd.Dv, s);
  }
  void dsa_select(Policy pol, const CoreDims& cd, const T* iq, const int64_t* qpos, const int64_t* qdoc, int64_t Nq,
                  const T* kv, int64_t S, int32_t* sel, Stream s, loc_t loc) override {
    in_->dsa_select(pol, cd, iq, qpos, qdoc, Nq, kv, S, sel, s, loc);
  }
  void dsa_core_forward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                        const T* kv, int64_t S, const int32_t* sel, T* o, T* stats, T* ikl, Stream s,
                        loc_t loc) override {
    in_->dsa_core_forward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, ikl, s, loc);
    flip("dsa_core_forward", o, Nq * cd.H * cd.Dv, s);
  }
  void dsa_core_backward(Policy pol, const CoreDims& cd, const T* q, const T* iq, const int64_t* qpos, int64_t Nq,
                         const T* kv, int64_t S, const int32_t* sel, const T* o, const T* stats, const T* dO, T iscale,
                         Segs qsegs, T* dq, T* diq, ExactAcc<T>* dkv, Stream s, loc_t loc) override {
    in_->dsa_core_backward(pol, cd, q, iq, qpos, Nq, kv, S, sel, o, stats, dO, iscale, qsegs, dq, diq, dkv, s, loc);
    flip("dsa_core_backward", dq, Nq * cd.H * cd.Dq, s);
  }
  void attn_doc_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, const int64_t* qdoc,
                              int64_t Nq, const T* kv, int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs,
                              T* dq, ExactAcc<T>* dkv, Stream s, loc_t loc) override {
    in_->attn_doc_core_backward(pol, cd, q, qpos, qdoc, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, s, loc);
    flip("attn_doc_core_backward", dq, Nq * cd.H * cd.Dq, s);
  }
  void attn_core_forward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                         int64_t S, T* o, T* stats, Stream s, loc_t loc) override {
    in_->attn_core_forward(pol, cd, q, qpos, Nq, kv, S, o, stats, s, loc);
    flip("attn_core_forward", o, Nq * cd.H * cd.Dv, s);
  }
  void attn_core_backward(Policy pol, const CoreDims& cd, const T* q, const int64_t* qpos, int64_t Nq, const T* kv,
                          int64_t S, const T* o, const T* stats, const T* dO, Segs qsegs, T* dq, ExactAcc<T>* dkv,
                          Stream s, loc_t loc) override {
    in_->attn_core_backward(pol, cd, q, qpos, Nq, kv, S, o, stats, dO, qsegs, dq, dkv, s, loc);
    flip("attn_core_backward", dq, Nq * cd.H * cd.Dq, s);
  }
  void attn_out_forward(Policy pol, const Config& cfg, const AttnW& W, int64_t N, const AttnBufs& acts, T* y, Stream s,
                        loc_t loc) override {
    in_->attn_out_forward(pol, cfg, W, N, acts, y, s, loc);
    flip("attn_out_forward", y, N * cfg.d_model, s);
  }
  void attn_out_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, int64_t N,
                         const AttnBufs& acts, const T* dy, Segs segs, T* dO, Stream s, loc_t loc) override {
    in_->attn_out_backward(pol, cfg, W, G, N, acts, dy, segs, dO, s, loc);
    flip("attn_out_backward", dO, m::AttnActSizes::of(cfg, N).o, s);
  }
  void attn_qkv_backward(Policy pol, const Config& cfg, const AttnW& W, const AttnG& G, const T* a,
                         const int64_t* pos, int64_t N, const Rope& rope, const AttnBufs& acts, const T* dqc,
                         const T* dpayload, Segs segs, T* da, Stream s, loc_t loc) override {
    in_->attn_qkv_backward(pol, cfg, W, G, a, pos, N, rope, acts, dqc, dpayload, segs, da, s, loc);
    flip("attn_qkv_backward", da, N * cfg.d_model, s);
  }
  void linear_ce_forward(Policy pol, const T* hidden, const T* W, const int32_t* targets, int64_t N, int64_t d,
                         int64_t V, int64_t vocab_chunk, int64_t token_chunk, T* token_loss, T* lse, Stream s,
                         loc_t loc) override {
    in_->linear_ce_forward(pol, hidden, W, targets, N, d, V, vocab_chunk, token_chunk, token_loss, lse, s, loc);
    flip("linear_ce_forward", token_loss, N, s);
  }
  void linear_ce_backward(Policy pol, const T* hidden, const T* W, const int32_t* targets, const T* lse, int64_t N,
                          int64_t d, int64_t V, int64_t vocab_chunk, int64_t token_chunk, T grad_scale, Segs segs,
                          int64_t j_begin, int64_t j_end, T* dhidden, ExactAcc<T>* dW, Stream s, loc_t loc) override {
    in_->linear_ce_backward(pol, hidden, W, targets, lse, N, d, V, vocab_chunk, token_chunk, grad_scale, segs, j_begin,
                            j_end, dhidden, dW, s, loc);
    flip("linear_ce_backward", dhidden, N * d, s);
  }
  void grad_sq_acc(const T* g, int64_t n, ExactAcc<double>* acc, Stream s, loc_t loc) override {
    in_->grad_sq_acc(g, n, acc, s, loc);
  }
  void adamw_step(T* w, const T* g, T* mo, T* v, int64_t n, const m::AdamWHyper& hyper, int64_t step, double clip,
                  bool decay, Stream s, loc_t loc) override {
    in_->adamw_step(w, g, mo, v, n, hyper, step, clip, decay, s, loc);
    flip("adamw_step", w, n, s);
  }
  void router_bias_update(T* b, const int64_t* load, int64_t E, double gamma, Stream s, loc_t loc) override {
    in_->router_bias_update(b, load, E, gamma, s, loc);
    flip("router_bias_update", b, E, s);
  }

 private:
  // Flips the lowest mantissa bit of out[index_] (one ulp), on stream s after the op.
  void flip(const char* op, T* out, int64_t n, Stream s) {
    if (op_ != op) return;
    perturb_stats_.calls.fetch_add(1);
    if (index_ >= n || !out) return;
    perturb_stats_.flips.fetch_add(1);
    T v{};
    dev_.download(&v, out + index_, static_cast<int64_t>(sizeof(T)), s);
    dev_.synchronize(s);
    using Bits = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
    v = std::bit_cast<T>(static_cast<Bits>(std::bit_cast<Bits>(v) ^ Bits{1}));
    dev_.upload(out + index_, &v, static_cast<int64_t>(sizeof(T)), s);
  }
  std::unique_ptr<Kernels<T>> in_;
  Device& dev_;
  std::string op_;
  int64_t index_;
};

}  // namespace

PerturbStats& perturb_stats() { return perturb_stats_; }

const std::vector<std::string>& kernel_ops() {
  static const std::vector<std::string> ops = {
      "mm", "wgrad_acc", "sum_acc", "exact_round", "embedding_forward", "embedding_backward", "rmsnorm_forward",
      "rmsnorm_backward", "residual_forward", "swiglu_forward", "swiglu_backward_dgrad", "expert_forward",
      "expert_backward_dgrad", "router_forward", "router_backward", "moe_combine_forward", "moe_combine_backward",
      "moe_dx_sum", "gather_rows", "scatter_rows", "attn_qkv_forward", "kv_zigzag_reorder",
      "kv_zigzag_to_gather_acc", "attn_core_forward", "attn_core_backward", "attn_doc_core_forward",
      "attn_doc_core_backward", "dsa_select", "dsa_core_forward", "dsa_core_backward", "attn_out_forward",
      "attn_out_backward",
      "attn_qkv_backward", "linear_ce_forward", "linear_ce_backward", "grad_sq_acc", "adamw_step",
      "router_bias_update"};
  return ops;
}

const std::vector<std::string>& packed_only_ops() {
  static const std::vector<std::string> ops = {"attn_doc_core_forward", "attn_doc_core_backward"};
  return ops;
}
const std::vector<std::string>& dsa_only_ops() {
  static const std::vector<std::string> ops = {"dsa_select", "dsa_core_forward", "dsa_core_backward"};
  return ops;
}

template <class T>
std::vector<NamedTensor> run_case(const PrimCase& c, Kernels<T>& k, Device& dev) {
  return replay<T>(c, k, dev, false, true);
}
template <class T>
void validate_case(const PrimCase& c) {
  const auto& table = op_table<T>();
  auto it = table.find(c.op);
  if (it == table.end()) fail(fmt::format("primitive case {}/{} (rank {}): unknown op '{}'", c.op, c.name, c.rank, c.op));
  Scratch<T> s;
  PrimCase& cc = const_cast<PrimCase&>(c);  // replay only reads it
  Binder<T> b(Mode::replay, s.dev, s.dev.compute_stream(), cc, &s.k);
  b.expect_outputs = true;
  b.skip_call = true;
  replay_checked(it->second, b, c);
}
void validate_cases(const PrimitivesFile& f) {
  for (const PrimCase& c : f.cases) {
    if (c.dtype == "f64") validate_case<double>(c);
    else if (c.dtype == "f32") validate_case<float>(c);
    else fail(fmt::format("primitive case {}/{} (rank {}): dtype '{}'", c.op, c.name, c.rank, c.dtype.substr(0, 64)));
  }
}
template <class T>
std::vector<NamedTensor> reference_outputs(const PrimCase& c, bool abs_inputs) {
  Scratch<T> s;
  return replay<T>(c, s.k, s.dev, abs_inputs);
}

bool Recorder::claim(int rank, const std::string& op, const std::string& signature, std::string& name) {
  std::lock_guard lk(mu_);
  auto& seen = seen_[{rank, op}];
  if (seen.count(signature) || static_cast<int>(seen.size()) >= max_cases_) return false;
  name = fmt::format("c{}", seen.size());
  seen.insert(signature);
  return true;
}
void Recorder::add(PrimCase c) {
  std::lock_guard lk(mu_);
  cases_.push_back(std::move(c));
}
std::vector<PrimCase> Recorder::take() {
  std::lock_guard lk(mu_);
  std::vector<PrimCase> out = std::move(cases_);
  const auto& ops = kernel_ops();
  auto order = [&](const std::string& op) { return std::find(ops.begin(), ops.end(), op) - ops.begin(); };
  std::sort(out.begin(), out.end(), [&](const PrimCase& a, const PrimCase& b) {
    return std::tuple(a.rank, order(a.op), a.name) < std::tuple(b.rank, order(b.op), b.name);
  });
  return out;
}

template <class T>
std::unique_ptr<Kernels<T>> make_recording_kernels(std::unique_ptr<Kernels<T>> inner, Device& dev, int rank,
                                                   Recorder& rec) {
  return std::make_unique<RecordingKernels<T>>(std::move(inner), dev, rank, rec);
}
template <class T>
std::unique_ptr<Kernels<T>> make_perturbed_kernels(std::unique_ptr<Kernels<T>> inner, Device& dev, std::string op,
                                                   int64_t index) {
  const auto& ops = kernel_ops();
  if (std::find(ops.begin(), ops.end(), op) == ops.end())
    fail(fmt::format("perturbed kernels: unknown op '{}'", op));
  return std::make_unique<PerturbedKernels<T>>(std::move(inner), dev, std::move(op), index);
}

#define TD_INST(T)                                                                                                  \
  template std::vector<NamedTensor> run_case<T>(const PrimCase&, Kernels<T>&, Device&);                             \
  template std::vector<NamedTensor> reference_outputs<T>(const PrimCase&, bool);                                          \
  template void validate_case<T>(const PrimCase&);                                                                  \
  template std::unique_ptr<Kernels<T>> make_recording_kernels<T>(std::unique_ptr<Kernels<T>>, Device&, int,        \
                                                                 Recorder&);                                        \
  template std::unique_ptr<Kernels<T>> make_perturbed_kernels<T>(std::unique_ptr<Kernels<T>>, Device&, std::string, \
                                                                 int64_t);
TD_INST(float)
TD_INST(double)
#undef TD_INST

}  // namespace trident::golden
