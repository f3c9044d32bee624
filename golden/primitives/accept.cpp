// The derived acceptance rule (golden/primitives/accept.h; docs/numerics.md "Acceptance rule" states every chain).
#include "golden/primitives/accept.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>

#include "golden/primitives/accept_calc.h"
#include "golden/primitives/bounds.h"
#include "reference/bf16.h"
#include "reference/check.h"
#include "reference/tolerances.h"

namespace trident::golden {

namespace {

using namespace accept_detail;

// RMSNorm forward: ss = sum x^2 (d terms); m = ss / d; s = m + eps; r = rsqrt(s); y = (x r) g.
Rules rmsnorm_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const int64_t N = si(c, "N"), d = si(c, "d"), ldx = si(c, "ldx"), ldy = si(c, "ldy");
  const double eps = sf(c, "eps");
  const std::vector<double> x = values(c, "x"), g = values(c, "g");
  std::vector<double> by(static_cast<size_t>(N * ldy), 0.0), my = by, br(static_cast<size_t>(N)), mr = br;
  for (int64_t r = 0; r < N; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[r * ldx + i] * x[r * ldx + i];
    const double b_ss = k.sum(static_cast<double>(d), ss, 0.0);
    const double m = ss / static_cast<double>(d), b_m = b_ss / static_cast<double>(d) + k.rnd(m);
    const double s = m + eps, b_s = b_m + k.rnd(s);
    const double ri = 1.0 / std::sqrt(s), b_r = k.fn(ri, 0.5 * ri / s, b_s);
    br[static_cast<size_t>(r)] = b_r, mr[static_cast<size_t>(r)] = ri;
    for (int64_t i = 0; i < d; ++i) {
      const double xi = x[r * ldx + i], xr = xi * ri, b_xr = k.mul(xi, 0, ri, b_r);
      const size_t o = static_cast<size_t>(r * ldy + i);
      by[o] = k.mul(xr, b_xr, g[i], 0);
      my[o] = std::fabs(xr * g[i]);
    }
  }
  Rules out;
  out.emplace("y", composite(by, my, acc));
  out.emplace("rinv", composite(br, mr, acc));
  return out;
}

// RMSNorm backward: xh = x r; dxh = dy g; c = (sum dxh xh) / d; dx = r (dxh - xh c); dg = tile sums of dy xh.
Rules rmsnorm_backward_rules(const PrimCase& c, const Calc& k, const std::string& acc,
                             const std::vector<NamedTensor>& abs_out) {
  const int64_t N = si(c, "N"), d = si(c, "d"), ldx = si(c, "ldx"), lddy = si(c, "lddy"), lddx = si(c, "lddx");
  const std::vector<double> dy = values(c, "dy"), x = values(c, "x"), ri = values(c, "rinv"), g = values(c, "g");
  std::vector<double> bdx(static_cast<size_t>(N * lddx), 0.0), mdx = bdx;
  for (int64_t r = 0; r < N; ++r) {
    const double rr = ri[static_cast<size_t>(r)];
    double cs = 0, s = 0, bt = 0;
    for (int64_t i = 0; i < d; ++i) {
      const double xh = x[r * ldx + i] * rr, dxh = dy[r * lddy + i] * g[i];
      cs += dxh * xh, s += std::fabs(dxh * xh);
      bt += std::fabs(dxh) * k.rnd(xh) + std::fabs(xh) * k.rnd(dxh);
    }
    const double b_sum = k.sum(static_cast<double>(d), s, bt);
    const double cc = cs / static_cast<double>(d), b_c = b_sum / static_cast<double>(d) + k.rnd(cc);
    for (int64_t i = 0; i < d; ++i) {
      const double xh = x[r * ldx + i] * rr, dxh = dy[r * lddy + i] * g[i];
      const double t = xh * cc, b_t = k.mul(xh, k.rnd(xh), cc, b_c);
      const double e = dxh - t, b_e = k.add(dxh, k.rnd(dxh), -t, b_t);
      const size_t o = static_cast<size_t>(r * lddx + i);
      bdx[o] = k.mul(rr, 0, e, b_e);
      mdx[o] = std::fabs(rr) * (std::fabs(dxh) + std::fabs(t));
    }
  }
  Rules out;
  out.emplace("dx", composite(bdx, mdx, acc));
  // dg: a tile sum of the N rows' products dy * (x * rinv) (3 factors: 2 roundings per term)
  if (const NamedTensor* a = find(abs_out, "dg")) {
    const std::vector<double> s = values_as_double(*a);
    out.emplace("dg", sum_rule(s, static_cast<double>(N + 1), acc));
  }
  return out;
}

// The bf16 policy's roundings inside an op (an intermediate rounded to bf16 as a GEMM operand): each term of the GEMM
// whose operand is rounded moves by at most u_bf16 |term| on either side, at whichever value that side rounds; the
// oracle rounds nothing inside. Adds k_const u_bf16 sum|terms| (the composite bf16 row) to the bound and the bf16
// magnitude to the relative test's floor.
void add_bf16(Rule& r, const std::vector<double>& terms) {
  const Tolerance& t = tolerance("composite", "bf16", "accept");
  for (size_t i = 0; i < r.bound.size(); ++i) r.bound[i] += t.k_const * unit_roundoff("bf16") * terms[i];
  r.u_bf16_floor = unit_roundoff("bf16") * rms(terms);
}

// SwiGLU forward: ug = x wg; uu = x wu; h = silu(ug) uu; y = h wd. Under the bf16 policy x and the weights are
// rounded operands (as the oracle's inputs), and h is rounded to bf16 for the down projection: y's bf16 term
// sum_f abs(h wd).
Rules swiglu_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const int64_t N = si(c, "N"), d = si(c, "d"), F = si(c, "F");
  const std::vector<double> x = values(c, "x"), wg = values(c, "wg"), wu = values(c, "wu"), wd = values(c, "wd");
  const Mat ug = gemm(k, x.data(), nullptr, N, d, wg.data(), nullptr, F, false);
  const Mat uu = gemm(k, x.data(), nullptr, N, d, wu.data(), nullptr, F, false);
  std::vector<double> h(static_cast<size_t>(N * F)), bh = h, mh = h;
  for (size_t i = 0; i < h.size(); ++i) {
    const double z = ug.v[i], sg = sigmoid(z), si_ = z * sg, dsi = sg * (1 + z * (1 - sg));
    const double b_si = k.fn(si_, dsi, ug.b[i]);
    h[i] = si_ * uu.v[i];
    bh[i] = k.mul(si_, b_si, uu.v[i], uu.b[i]);
    mh[i] = std::fabs(h[i]);
  }
  const Mat y = gemm(k, h.data(), bh.data(), N, F, wd.data(), nullptr, d, false);
  Rules out;
  out.emplace("ug", composite(ug.b, ug.s, acc));
  out.emplace("uu", composite(uu.b, uu.s, acc));
  out.emplace("h", composite(bh, mh, acc));
  Rule ry = composite(y.b, y.s, acc);
  if (c.policy == "bf16") add_bf16(ry, y.s);
  out.emplace("y", std::move(ry));
  return out;
}

// SwiGLU dgrad: dh = dy wd^T; sg = sigmoid(ug); dug = (dh uu) (sg (1 + ug (1 - sg))); duu = dh silu(ug);
// dx = dug wg^T + duu wu^T. Under the bf16 policy dug and duu are rounded to bf16 for the dx GEMMs: dx's bf16 term
// sum_f abs(dug wg) + abs(duu wu).
Rules swiglu_dgrad_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const int64_t N = si(c, "N"), d = si(c, "d"), F = si(c, "F");
  const std::vector<double> dy = values(c, "dy"), wg = values(c, "wg"), wu = values(c, "wu"), wd = values(c, "wd"),
                            ug = values(c, "ug"), uu = values(c, "uu");
  const Mat dh = gemm(k, dy.data(), nullptr, N, d, wd.data(), nullptr, F, true);
  std::vector<double> dug(static_cast<size_t>(N * F)), bdug = dug, mdug = dug, duu = dug, bduu = dug, mduu = dug;
  for (size_t i = 0; i < dug.size(); ++i) {
    const double z = ug[i], sg = sigmoid(z), b_sg = k.phi * k.rnd(sg);
    const double om = 1 - sg, b_om = b_sg + k.rnd(om);
    const double t = z * om, b_t = k.mul(z, 0, om, b_om);
    const double p = 1 + t, b_p = b_t + k.rnd(p);
    const double q = sg * p, b_q = k.mul(sg, b_sg, p, b_p);
    const double a = dh.v[i] * uu[i], b_a = k.mul(dh.v[i], dh.b[i], uu[i], 0);
    dug[i] = a * q, bdug[i] = k.mul(a, b_a, q, b_q), mdug[i] = std::fabs(dug[i]);
    const double sl = z * sg, b_sl = k.phi * k.rnd(sl);
    duu[i] = dh.v[i] * sl, bduu[i] = k.mul(dh.v[i], dh.b[i], sl, b_sl), mduu[i] = std::fabs(duu[i]);
  }
  const Mat dx1 = gemm(k, dug.data(), bdug.data(), N, F, wg.data(), nullptr, d, true);
  const Mat dx2 = gemm(k, duu.data(), bduu.data(), N, F, wu.data(), nullptr, d, true);
  std::vector<double> bdx(dx1.b.size()), mdx = bdx;
  for (size_t i = 0; i < bdx.size(); ++i) {
    bdx[i] = k.add(dx1.v[i], dx1.b[i], dx2.v[i], dx2.b[i]) + 2.0 * k.u * (dx1.s[i] + dx2.s[i]);  // one 2F-term sum
    mdx[i] = dx1.s[i] + dx2.s[i];
  }
  Rules out;
  out.emplace("dug", composite(bdug, mdug, acc));
  out.emplace("duu", composite(bduu, mduu, acc));
  Rule rdx = composite(bdx, mdx, acc);
  if (c.policy == "bf16") add_bf16(rdx, mdx);
  out.emplace("dx", std::move(rdx));
  return out;
}

// Router forward: logits = a wr; s = sigmoid(logits); sel exact; ssum = sum of the selected s; gates = alpha s / ssum.
Rules router_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc,
                           const std::vector<NamedTensor>& ref) {
  const int64_t N = si(c, "N"), d = si(c, "d"), E = si(c, "E"), K = si(c, "K");
  const double alpha = sf(c, "alpha");
  const std::vector<double> a = values(c, "a"), wr = values(c, "wr");
  const Mat lg = gemm(k, a.data(), nullptr, N, d, wr.data(), nullptr, E, false);
  std::vector<double> s(lg.v.size()), bs = s, ms = s;
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] = sigmoid(lg.v[i]);
    bs[i] = k.fn(s[i], s[i] * (1 - s[i]), lg.b[i]);
    ms[i] = s[i];
  }
  const NamedTensor* selt = find(ref, "sel");
  const std::vector<int32_t> sel = selt ? values_i32(*selt) : std::vector<int32_t>{};
  std::vector<double> bg(static_cast<size_t>(N * K), 0.0), mg = bg;
  for (int64_t r = 0; r < N && static_cast<int64_t>(sel.size()) == N * K; ++r) {
    double ssum = 0, bt = 0;
    for (int64_t q = 0; q < K; ++q) {
      const size_t e = static_cast<size_t>(r * E + sel[static_cast<size_t>(r * K + q)]);
      ssum += s[e], bt += bs[e];
    }
    const double b_ssum = k.sum(static_cast<double>(K), ssum, bt);
    for (int64_t q = 0; q < K; ++q) {
      const size_t e = static_cast<size_t>(r * E + sel[static_cast<size_t>(r * K + q)]);
      const double num = alpha * s[e], b_num = k.mul(alpha, 0, s[e], bs[e]);
      const size_t o = static_cast<size_t>(r * K + q);
      bg[o] = k.div(num, b_num, ssum, b_ssum);
      mg[o] = std::fabs(num / ssum);
    }
  }
  Rules out;
  out.emplace("logits", composite(lg.b, lg.s, acc));
  out.emplace("scores", composite(bs, ms, acc));
  out.emplace("gates", composite(bg, mg, acc));
  return out;
}

// Router backward: ssum = sum s_sel; c = sum dgate s_sel; cs = c / ssum; ds = (alpha (dgate - cs)) / ssum;
// dlogit = ds (s (1 - s)) on the selected experts, exactly 0 elsewhere.
Rules router_backward_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const int64_t N = si(c, "N"), E = si(c, "E"), K = si(c, "K");
  const double alpha = sf(c, "alpha");
  const std::vector<double> dg = values(c, "dgates"), s = values(c, "scores");
  const std::vector<int32_t> sel = values_i32(input(c, "sel"));
  std::vector<double> b(static_cast<size_t>(N * E), 0.0), m = b;
  for (int64_t r = 0; r < N; ++r) {
    double ssum = 0, cc = 0, cabs = 0;
    for (int64_t q = 0; q < K; ++q) {
      const double se = s[static_cast<size_t>(r * E + sel[static_cast<size_t>(r * K + q)])];
      ssum += se, cc += dg[static_cast<size_t>(r * K + q)] * se, cabs += std::fabs(dg[static_cast<size_t>(r * K + q)] * se);
    }
    const double b_ssum = k.sum(static_cast<double>(K), ssum, 0.0), b_c = k.sum(static_cast<double>(K), cabs, 0.0);
    const double cs = cc / ssum, b_cs = k.div(cc, b_c, ssum, b_ssum);
    for (int64_t q = 0; q < K; ++q) {
      const int64_t e = sel[static_cast<size_t>(r * K + q)];
      const double se = s[static_cast<size_t>(r * E + e)], dgk = dg[static_cast<size_t>(r * K + q)];
      const double df = dgk - cs, b_df = k.add(dgk, 0, -cs, b_cs);
      const double nu = alpha * df, b_nu = k.mul(alpha, 0, df, b_df);
      const double ds = nu / ssum, b_ds = k.div(nu, b_nu, ssum, b_ssum);
      const double om = 1 - se, w = se * om, b_w = k.mul(se, 0, om, k.rnd(om));
      const size_t o = static_cast<size_t>(r * E + e);
      b[o] = k.mul(ds, b_ds, w, b_w);
      m[o] = std::fabs(alpha * (std::fabs(dgk) + std::fabs(cs)) / ssum * w);
    }
  }
  Rules out;
  out.emplace("dlogits", composite(b, m, acc));
  return out;
}

// AdamW: gc = g c; w *= dec; m = b1 m + ob1 gc; v = b2 v + (ob2 gc) gc; den = sqrt(v) / bc2s + e;
// w = w - (ss m) / den (reference/model/adamw.h). Another formulation (torch's lerp for m, addcdiv) rounds the same
// quantities a few more times: within the composite row's factor 2.
Rules adamw_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const double lr = sf(c, "lr"), b1 = sf(c, "beta1"), b2 = sf(c, "beta2"), eps = sf(c, "eps"),
               wd = sf(c, "weight_decay"), clip = sf(c, "clip");
  const int64_t step = si(c, "step");
  const bool decay = c.shapes.at("decay").get<bool>();
  double p1 = 1, p2 = 1;
  for (int64_t s = 0; s < step; ++s) p1 *= b1, p2 *= b2;
  const double ss = lr / (1 - p1), bc2s = std::sqrt(1 - p2), dec = decay ? 1 - lr * wd : 1.0;
  const std::vector<double> w = values(c, "w"), g = values(c, "g"), m = values(c, "m"), v = values(c, "v");
  const size_t n = w.size();
  std::vector<double> bw(n), mw(n), bm(n), mm_(n), bv(n), mv(n);
  for (size_t i = 0; i < n; ++i) {
    const double gc = g[i] * clip, b_gc = k.rnd(gc);
    const double m1 = b1 * m[i] + (1 - b1) * gc;
    bm[i] = 4 * k.u * (std::fabs(b1 * m[i]) + std::fabs((1 - b1) * gc)) + (1 - b1) * b_gc + k.rnd(m1);
    mm_[i] = std::fabs(b1 * m[i]) + std::fabs((1 - b1) * gc);
    const double v1 = b2 * v[i] + (1 - b2) * gc * gc;
    bv[i] = 4 * k.u * (std::fabs(b2 * v[i]) + (1 - b2) * gc * gc) + 2 * (1 - b2) * std::fabs(gc) * b_gc + k.rnd(v1);
    mv[i] = std::fabs(b2 * v[i]) + (1 - b2) * gc * gc;
    const double sq = std::sqrt(v1);
    const double b_sq = sq > 0 ? k.fn(sq, 0.5 / sq, bv[i]) : std::sqrt(bv[i]);
    const double q = sq / bc2s, b_q = b_sq / bc2s + 2 * k.rnd(q);  // the division and bc2s's own rounding
    const double den = q + eps, b_den = b_q + k.rnd(den) + k.rnd(eps);
    const double upd = ss * m1 / den;
    const double b_upd = std::fabs(ss) * (bm[i] / den + std::fabs(m1) * b_den / (den * den)) + 3 * k.rnd(upd);
    const double wdec = w[i] * dec, b_wdec = decay ? 2 * k.rnd(wdec) : 0.0;
    bw[i] = b_wdec + b_upd + k.rnd(wdec - upd);
    mw[i] = std::fabs(wdec) + std::fabs(upd);
  }
  Rules out;
  out.emplace("w", composite(bw, mw, acc));
  out.emplace("m", composite(bm, mm_, acc));
  out.emplace("v", composite(bv, mv, acc));
  return out;
}

// The ops whose outputs a correct implementation cannot change: copies (embedding_forward, gather_rows,
// scatter_rows, kv_zigzag_reorder, kv_zigzag_to_gather_acc), one IEEE rounding (residual_forward: a + b;
// router_bias_update: b +- gamma; exact_round: the correctly rounded sum).
bool exact_op(const std::string& op) {
  static const std::set<std::string> ops = {"embedding_forward", "gather_rows",      "scatter_rows",
                                            "kv_zigzag_reorder", "kv_zigzag_to_gather_acc", "residual_forward",
                                            "router_bias_update", "exact_round"};
  return ops.count(op) > 0;
}

// The per-element rules of a case's floating outputs, by output name (empty for ops without a derived chain).
Rules case_rules(const PrimCase& c, const std::vector<NamedTensor>& ref) {
  Rules out;
  const std::string acc = c.dtype == "f64" ? "fp64" : "fp32";
  const Calc k{unit_roundoff(acc), tolerance("composite", acc, "accept").k_per_term};
  auto absd = [&] { return reference_outputs<double>(widened_case(c), true); };
  auto abs_of = [&](const std::vector<NamedTensor>& a, const std::string& name) {
    const NamedTensor* t = find(a, name);
    return t ? values_as_double(*t) : std::vector<double>{};
  };
  const std::string& op = c.op;
  const std::map<std::string, ElemBounds> eb = elem_bounds(c);
  if (!eb.empty()) {
    for (const auto& [name, e] : eb) out.emplace(name, from_elem(e, acc));
  } else if (op == "sum_acc") {
    const std::vector<int64_t> segs = ints64(c, "segs");
    const double rows = segs.empty() ? 0.0 : static_cast<double>(segs.back() - segs.front());
    out.emplace("acc", sum_rule(abs_of(absd(), "acc"), rows, acc));
  } else if (op == "embedding_backward") {
    out.emplace("dembed", sum_rule(abs_of(absd(), "dembed"), static_cast<double>(si(c, "N")), acc));
  } else if (op == "moe_combine_forward") {
    out.emplace("out", sum_rule(abs_of(absd(), "out"), static_cast<double>(si(c, "K") + 1), acc));
  } else if (op == "moe_combine_backward") {
    const std::vector<NamedTensor> a = absd();
    out.emplace("dgates", sum_rule(abs_of(a, "dgates"), static_cast<double>(si(c, "d") + 1), acc));
    out.emplace("dyk", sum_rule(abs_of(a, "dyk"), 1.0, acc));
  } else if (op == "moe_dx_sum") {
    out.emplace("dx", sum_rule(abs_of(absd(), "dx"), static_cast<double>(si(c, "K")), acc));
  } else if (op == "grad_sq_acc") {
    // the exact sum of squares rounded once to f64: a correct implementation sums the squares in fp64
    out.emplace("sq", sum_rule(abs_of(absd(), "sq"), static_cast<double>(si(c, "n") + 1), "fp64"));
  } else if (op == "rmsnorm_forward") {
    out = rmsnorm_forward_rules(c, k, acc);
  } else if (op == "rmsnorm_backward") {
    out = rmsnorm_backward_rules(c, k, acc, absd());
  } else if (op == "swiglu_forward" || op == "expert_forward") {
    out = swiglu_forward_rules(c, k, acc);
  } else if (op == "swiglu_backward_dgrad" || op == "expert_backward_dgrad") {
    out = swiglu_dgrad_rules(c, k, acc);
  } else if (op == "router_forward") {
    out = router_forward_rules(c, k, acc, ref);
  } else if (op == "router_backward") {
    out = router_backward_rules(c, k, acc);
  } else if (op == "adamw_step") {
    out = adamw_rules(c, k, acc);
  } else {
    out = attn_rules(c, k, acc, ref);
  }
  return out;
}

bool is_float(const std::string& dtype) { return dtype == "f32" || dtype == "f64"; }

}  // namespace

std::map<std::string, ElemBounds> elem_bounds(const PrimCase& c) {
  std::map<std::string, ElemBounds> out;
  const bool bf = c.policy == "bf16";
  const std::string& op = c.op;
  if (op == "mm") {
    const std::vector<double> A = values(c, "A"), B = values(c, "B");
    out.emplace("C", mm_bounds(si(c, "M"), si(c, "N"), si(c, "K"), A.data(), si(c, "lda"), B.data(), si(c, "ldb"),
                               c.shapes.at("trans_b").get<bool>(), si(c, "ldc")));
  } else if (op == "wgrad_acc") {
    const std::vector<double> X = values(c, "X"), dY = values(c, "dY");
    const std::vector<int64_t> segs = ints64(c, "segs");
    out.emplace("acc", wgrad_bounds(X.data(), si(c, "ldx"), dY.data(), si(c, "ldy"), si(c, "K"), si(c, "M"), segs));
  } else if (op == "attn_core_forward" || op == "attn_doc_core_forward") {
    const std::vector<double> q = values(c, "q"), kv = values(c, "kv");
    const std::vector<int64_t> qpos = ints64(c, "qpos");
    const std::vector<int64_t> qdoc = has_input(c, "qdoc") ? ints64(c, "qdoc") : std::vector<int64_t>{};
    AttnFwdBounds b = attn_forward_bounds(core_dims(c), bf, q.data(), qpos.data(), qdoc.empty() ? nullptr : qdoc.data(),
                                          si(c, "Nq"), kv.data());
    out.emplace("o", b.o);
    out.emplace("stats", b.stats);
  } else if (op == "attn_core_backward" || op == "attn_doc_core_backward") {
    const std::vector<double> q = values(c, "q"), kv = values(c, "kv"), o = values(c, "o"), st = values(c, "stats"),
                              dO = values(c, "dO");
    const std::vector<int64_t> qpos = ints64(c, "qpos"), qsegs = ints64(c, "qsegs");
    const std::vector<int64_t> qdoc = has_input(c, "qdoc") ? ints64(c, "qdoc") : std::vector<int64_t>{};
    AttnBwdBounds b = attn_backward_bounds(core_dims(c), bf, q.data(), qpos.data(), qdoc.empty() ? nullptr : qdoc.data(),
                                           si(c, "Nq"), kv.data(), si(c, "S"), o.data(), st.data(), dO.data(), qsegs);
    out.emplace("dq", b.dq);
    out.emplace("dkv", b.dkv);
  } else if (op == "linear_ce_forward") {
    const std::vector<double> h = values(c, "hidden"), W = values(c, "W");
    const std::vector<int32_t> t = values_i32(input(c, "targets"));
    CeFwdBounds b = linear_ce_forward_bounds(h.data(), W.data(), t.data(), si(c, "N"), si(c, "d"), si(c, "V"),
                                             si(c, "vocab_chunk"));
    out.emplace("token_loss", b.token_loss);
    out.emplace("lse", b.lse);
  } else if (op == "linear_ce_backward") {
    const std::vector<double> h = values(c, "hidden"), W = values(c, "W"), lse = values(c, "lse"),
                              dh = values(c, "dhidden");
    const std::vector<int32_t> t = values_i32(input(c, "targets"));
    const std::vector<int64_t> segs = ints64(c, "segs");
    CeBwdBounds b = linear_ce_backward_bounds(bf, h.data(), W.data(), t.data(), lse.data(), si(c, "N"), si(c, "d"),
                                              si(c, "V"), sf(c, "grad_scale"), segs, si(c, "j_begin"), si(c, "j_end"),
                                              dh.data());
    out.emplace("dhidden", b.dhidden);
    out.emplace("dW", b.dW);
  }
  return out;
}

// The router's selection is exact, and a near tie would make it ambiguous: per row, the margin between the K-th
// and the (K+1)-th largest biased score of the oracle, over the sum of the two scores' bounds. A margin above 1 means
// no correct implementation can select differently; the checked-in goldens' smallest is 13. Stored with the exact
// rule of `sel` ("margins": per row, "min_margin"), so a differing selection is reported with its row's margin.
static void note_tie_margins(PrimCase& c) {
  const NamedTensor *s = find(c.oracle, "scores"), *b = find(c.bound, "scores");
  if (!s || !b || !c.accept.contains("sel")) return;
  const int64_t N = si(c, "N"), E = si(c, "E"), K = si(c, "K");
  if (K <= 0 || K >= E) return;
  const std::vector<double> sv = values_as_double(*s), bv = values_as_double(*b), bias = values(c, "bias");
  nlohmann::json margins = nlohmann::json::array();
  double lo = INFINITY;
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t e = 0; e < E; ++e) idx[static_cast<size_t>(e)] = e;
    auto biased = [&](int64_t e) { return sv[static_cast<size_t>(r * E + e)] + bias[static_cast<size_t>(e)]; };
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return biased(x) > biased(y); });
    const int64_t a = idx[static_cast<size_t>(K - 1)], z = idx[static_cast<size_t>(K)];
    const double room = bv[static_cast<size_t>(r * E + a)] + bv[static_cast<size_t>(r * E + z)];
    const double m = room > 0 ? (biased(a) - biased(z)) / room : INFINITY;
    margins.push_back(std::isfinite(m) ? nlohmann::json(m) : nlohmann::json(1e300));
    lo = std::min(lo, m);
  }
  c.accept["sel"]["margins"] = margins;
  c.accept["sel"]["min_margin"] = std::isfinite(lo) ? lo : 1e300;
}

PrimCase widened_case(const PrimCase& c) {
  PrimCase w = c;
  w.dtype = "f64";
  if (!w.policy.empty()) w.policy = "fp64";
  for (NamedTensor& t : w.inputs) {
    if (t.dtype != "f32") continue;
    const std::vector<double> v = values(c, t.name);
    t = make_tensor(t.name, t.shape, std::span<const double>(v));
  }
  for (NamedTensor& t : w.outputs) {
    if (t.dtype != "f32") continue;
    const std::vector<double> v = values_as_double(t);
    t = make_tensor(t.name, t.shape, std::span<const double>(v));
  }
  w.sum_abs.clear(), w.oracle.clear(), w.bound.clear();
  return w;
}

void complete_accept(PrimCase& c) {
  c.oracle.clear(), c.bound.clear();
  c.accept = nlohmann::json::object();
  if (exact_op(c.op)) {
    for (const NamedTensor& o : c.outputs) c.accept[o.name] = {{"rule", "exact"}};
    return;
  }
  for (const NamedTensor& o : c.outputs)
    if (!is_float(o.dtype)) c.accept[o.name] = {{"rule", "exact"}};  // integers and selections (router sel, DSA top-k)
  const Rules rules = case_rules(c, c.outputs);
  if (rules.empty()) return;
  // the oracle: the case in fp64 (an fp64 case is its own oracle: nothing more precise exists here)
  const std::vector<NamedTensor> oracle =
      c.dtype == "f64" ? c.outputs : reference_outputs<double>(widened_case(c));
  const std::string acc = c.dtype == "f64" ? "fp64" : "fp32";
  const Tolerance& rel = tolerance("relative", "fp32", "accept");
  for (const NamedTensor& o : c.outputs) {
    auto it = rules.find(o.name);
    const NamedTensor* ot = find(oracle, o.name);
    if (it == rules.end() || !ot || !is_float(o.dtype)) continue;
    const Rule& r = it->second;
    if (static_cast<int64_t>(r.bound.size()) != o.numel())
      fail(fmt::format("accept: case {}/{}: {} bounds for output '{}' of {} elements", c.op, c.name, r.bound.size(),
                       o.name, o.numel()));
    const std::vector<double> ov = values_as_double(*ot);
    c.oracle.push_back(make_tensor(o.name, o.shape, std::span<const double>(ov)));
    c.bound.push_back(make_tensor(o.name, o.shape, std::span<const double>(r.bound)));
    const double u = o.name == "sq" ? unit_roundoff("fp64") : unit_roundoff(acc);
    const double floor = rel.k_per_term * (u * rms(r.mag) + r.u_bf16_floor);
    c.accept[o.name] = {{"rule", "bound"}, {"row", r.row}, {"k_rel", kAcceptRelK}, {"floor", floor}};
  }
  if (c.op == "router_forward") note_tie_margins(c);
}

// ---- judging --------------------------------------------------------------------------------------------------------
OutputVerdict judge_output(const PrimCase& c, const NamedTensor& got, const NamedTensor& want, bool bitwise) {
  OutputVerdict v;
  const int64_t n = want.numel();
  const size_t es = dtype_size(want.dtype);
  const nlohmann::json* a = c.accept.contains(want.name) ? &c.accept[want.name] : nullptr;
  const NamedTensor* oracle = find(c.oracle, want.name);
  const NamedTensor* bound = find(c.bound, want.name);
  const NamedTensor* sa = find(c.sum_abs, want.name);
  const bool use_bound = !bitwise && a && a->value("rule", "") == "bound" && oracle && bound;
  const bool use_sum_abs = !bitwise && !use_bound && !a && sa;
  v.rule = bitwise ? "bitwise" : use_bound ? "bound" : use_sum_abs ? "sum_abs" : a ? "exact" : "bitwise";
  auto msg_head = [&] { return fmt::format("{}/{} (rank {}): output '{}'", c.op, c.name, c.rank, want.name); };
  if (!use_bound && !use_sum_abs) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::memcmp(got.bytes.data() + i * static_cast<int64_t>(es), want.bytes.data() + i * static_cast<int64_t>(es),
                      es) == 0)
        continue;
      v.pass = false, v.index = i;
      v.got = element_as_double(got, i), v.want = element_as_double(want, i);
      v.worst_ratio = std::numeric_limits<double>::infinity();
      v.message = fmt::format("{} differs at element {}: got {}, golden {} ({})", msg_head(), i, fmtd(v.got),
                              fmtd(v.want),
                              bitwise         ? "bitwise contract"
                              : a             ? "exact rule: a correct implementation gives these bits"
                                              : "bitwise: no derived rule for this output yet");
      if (!bitwise && a && a->contains("margins") && (*a)["margins"].is_array() && want.shape.size() == 2 &&
          want.shape[1] > 0) {  // a selection: its row's tie margin says whether the golden can judge it
        const size_t row = static_cast<size_t>(i / want.shape[1]);
        if (row < (*a)["margins"].size() && (*a)["margins"][row].is_number()) {
          const double m = (*a)["margins"][row].get<double>();
          v.message += m > 1 ? fmt::format("; row {}'s top-k margin is {:.3g} times its scores' bounds, so no "
                                           "correct router selects differently", row, m)
                             : fmt::format("; row {} is a near tie (margin {:.3g} times its scores' bounds): a "
                                           "correct router may select either, so this golden cannot judge it", row, m);
        }
      }
      return v;
    }
    return v;
  }
  if (use_sum_abs) {  // a golden written before the derived rule: |got - golden| <= the stored sum_abs bound
    const nlohmann::json& tol = c.tolerance.at(want.name);
    const double k = (tol.at("k_const").get<double>() + tol.at("k_per_term").get<double>() *
                                                           c.n_terms.at(want.name).get<double>()) *
                     tol.at("u").get<double>();
    for (int64_t i = 0; i < n; ++i) {
      const double x = element_as_double(got, i), y = element_as_double(want, i), b = k * element_as_double(*sa, i);
      const double err = std::fabs(x - y), r = err == 0 ? 0.0 : b > 0 ? err / b : INFINITY;
      const double rr = std::isnan(r) ? INFINITY : r;
      if (rr > v.worst_ratio || v.index < 0) v.worst_ratio = std::max(v.worst_ratio, rr), v.index = i, v.got = x, v.want = y, v.bound = b;
    }
    if (!(v.worst_ratio <= 1)) {
      v.pass = false;
      v.message = fmt::format("{} element {}: got {}, golden {}, |err| {} > bound {}", msg_head(), v.index,
                              fmtd(v.got), fmtd(v.want), fmtd(std::fabs(v.got - v.want)),
                              fmtd(v.bound));
    }
    return v;
  }
  // the derived rule: guards, per element against the oracle, the relative test
  double eg = 0, er = 0;
  bool all_zero = true, want_nonzero = false, got_const = true, want_const = true;
  for (int64_t i = 0; i < n; ++i) {
    const double x = element_as_double(got, i), y = element_as_double(want, i), o = element_as_double(*oracle, i),
                 b = element_as_double(*bound, i);
    if (std::isfinite(o) && !std::isfinite(x)) {
      v.pass = false, v.index = i, v.got = x, v.want = y, v.bound = b, v.worst_ratio = INFINITY;
      v.message = fmt::format("{} element {} is {} where the golden is {} (non-finite)", msg_head(), i, fmtd(x),
                              fmtd(y));
      return v;
    }
    const double err = std::fabs(x - o), r = err == 0 ? 0.0 : b > 0 ? err / b : INFINITY;
    if (r > v.worst_ratio || v.index < 0) v.worst_ratio = std::max(v.worst_ratio, r), v.index = i, v.got = x, v.want = y, v.bound = b;
    if (std::isfinite(o)) eg += (x - o) * (x - o), er += (y - o) * (y - o);
    all_zero &= x == 0, want_nonzero |= y != 0;
    got_const &= x == element_as_double(got, 0), want_const &= y == element_as_double(want, 0);
  }
  const double floor = a->value("floor", 0.0), k_rel = a->value("k_rel", kAcceptRelK);
  const double nn = n > 0 ? static_cast<double>(n) : 1.0;
  eg = std::sqrt(eg / nn), er = std::sqrt(er / nn);
  const double limit = k_rel * er + floor;
  v.rel_ratio = limit > 0 ? eg / limit : (eg > 0 ? INFINITY : 0.0);
  if (!(v.worst_ratio <= 1)) {
    v.pass = false;
    v.message = fmt::format("{} element {}: got {}, golden {}, |got - fp64| {} > bound {} ({} rule)", msg_head(),
                            v.index, fmtd(v.got), fmtd(v.want),
                            fmtd(std::fabs(v.got - element_as_double(*oracle, v.index))), fmtd(v.bound),
                            a->value("row", ""));
  } else if (!(v.rel_ratio <= 1)) {
    v.pass = false;
    v.message = fmt::format("{}: rms error vs fp64 {} > {} x the reference's {} + floor {} (relative test)", msg_head(),
                            fmtd(eg), k_rel, fmtd(er), fmtd(floor));
  } else if (n > 1 && want_nonzero && all_zero) {
    v.pass = false;
    v.message = fmt::format("{} is all zeros where the golden is not (degenerate output)", msg_head());
  } else if (n > 1 && !want_const && got_const) {
    v.pass = false;
    v.message = fmt::format("{} is constant where the golden is not (degenerate output)", msg_head());
  }
  return v;
}

void add_to_report(OutputReport& r, const PrimCase& c, const std::string& output, const OutputVerdict& v) {
  OutputStat& s = r[{c.op, output}];
  if (s.rule.empty() || s.rule == v.rule) s.rule = v.rule;
  else if (s.rule.find(v.rule) == std::string::npos) s.rule += "+" + v.rule;
  ++s.cases;
  s.passed += v.pass ? 1 : 0;
  s.worst_ratio = std::max(s.worst_ratio, v.worst_ratio);
  s.worst_rel = std::max(s.worst_rel, v.rel_ratio);
}

nlohmann::json report_json(const OutputReport& r) {
  nlohmann::json j = nlohmann::json::array();
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json("inf"); };
  for (const auto& [key, s] : r)
    j.push_back({{"op", key.first},
                 {"output", key.second},
                 {"rule", s.rule},
                 {"cases", s.cases},
                 {"passed", s.passed},
                 {"worst_err_over_bound", num(s.worst_ratio)},
                 {"worst_relative", s.worst_rel < 0 ? nlohmann::json(nullptr) : num(s.worst_rel)},
                 {"status", s.passed == s.cases ? "PASS" : "FAIL"}});
  return j;
}

std::string report_text(const OutputReport& r) {
  std::string out = fmt::format("{:<24} {:<11} {:<8} {:>6} {:>12} {:>10}  {}\n", "op", "output", "rule", "cases",
                                "err/bound", "relative", "status");
  auto num = [](double x, bool bits) {
    if (bits) return std::string(x > 0 ? "differs" : "equal");
    return std::isfinite(x) ? fmt::format("{:.3g}", x) : std::string("inf");
  };
  for (const auto& [key, s] : r) {
    const bool bits = s.rule == "bitwise" || s.rule == "exact";
    out += fmt::format("{:<24} {:<11} {:<8} {:>6} {:>12} {:>10}  {}\n", key.first, key.second, s.rule, s.cases,
                       num(s.worst_ratio, bits), s.worst_rel < 0 ? std::string("-") : num(s.worst_rel, false),
                       s.passed == s.cases ? "PASS" : fmt::format("FAIL ({} of {})", s.cases - s.passed, s.cases));
  }
  return out;
}

}  // namespace trident::golden
