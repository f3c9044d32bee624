// The derived acceptance rule's chains for the attention projections and the DSA core (accept_calc.h).
#include <algorithm>

#include "golden/primitives/accept_calc.h"
#include "reference/model/config.h"

namespace trident::golden::accept_detail {

namespace {

using Vec = std::vector<double>;
inline size_t z(int64_t i) { return static_cast<size_t>(i); }

// Per element: value, first-order bound, magnitude of the last step's terms, and under the bf16 policy the bf16
// magnitude f: the bf16 roundings inside the op (intermediates rounded as GEMM operands, and inputs the op rounds for
// some uses only, which the oracle leaves unrounded) move the value by at most u_bf16 f to first order, f propagated
// through the chain like a bound (each rounding of an operand x adds |x| to its f; no rounding of f's own).
struct Val {
  Vec v, b, m, f;
  explicit Val(size_t n = 0) : v(n, 0.0), b(n, 0.0), m(n, 0.0), f(n, 0.0) {}
};
struct VB {
  double v, b, f = 0;
};
// x rounded to bf16 as a GEMM operand (bf: under the bf16 policy): |x| joins its bf16 magnitude.
inline VB r16(VB x, bool bf) { return VB{x.v, x.b, x.f + (bf ? std::fabs(x.v) : 0.0)}; }

// A sum of K products per element, C(i, j) = sum_q a(i, q) b(q, j) (a, b return value and bound): values, the
// magnitude s = sum |a b| and the terms' own bounds bt = sum (|a| bb + ba |b|) (the sum's rounding is k.sum's).
struct Prod {
  Vec v, s, bt, f;  // f: the bf16 magnitude sum (|a| fb + fa |b|)
  double K = 0;
  Vec bound(const Calc& k) const {
    Vec b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = k.sum(K, s[i], bt[i]);
    return b;
  }
  Val val(const Calc& k) const {
    Val x;
    x.v = v, x.b = bound(k), x.m = s, x.f = f;
    return x;
  }
};
template <class FA, class FB>
Prod prod(int64_t M, int64_t N, int64_t K, FA&& a, FB&& b) {
  Prod p;
  p.K = static_cast<double>(K);
  p.v.assign(z(M * N), 0.0), p.s = p.v, p.bt = p.v, p.f = p.v;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double v = 0, s = 0, bt = 0, f = 0;
      for (int64_t q = 0; q < K; ++q) {
        const VB x = a(i, q), y = b(q, j);
        v += x.v * y.v, s += std::fabs(x.v * y.v), bt += x.b * std::fabs(y.v) + std::fabs(x.v) * y.b;
        f += x.f * std::fabs(y.v) + std::fabs(x.v) * y.f;
      }
      p.v[z(i * N + j)] = v, p.s[z(i * N + j)] = s, p.bt[z(i * N + j)] = bt, p.f[z(i * N + j)] = f;
    }
  return p;
}
// One sum of the terms of several products (an implementation may fuse them into one chain, or add the products'
// results: one sum of all K1 + K2 + ... terms in any order bounds both).
Val fused(const Calc& k, std::initializer_list<const Prod*> ps) {
  const Prod& p0 = **ps.begin();
  Val x(p0.v.size());
  double K = 0;
  for (const Prod* p : ps) K += p->K;
  for (size_t i = 0; i < x.v.size(); ++i) {
    double s = 0, bt = 0;
    for (const Prod* p : ps) x.v[i] += p->v[i], s += p->s[i], bt += p->bt[i], x.f[i] += p->f[i];
    x.b[i] = k.sum(K, s, bt), x.m[i] = s;
  }
  return x;
}
inline auto exact_of(const Vec& v, int64_t ld, int64_t off = 0) {
  return [&v, ld, off](int64_t i, int64_t q) { return VB{v[z(i * ld + off + q)], 0.0}; };
}
inline auto exact_t(const Vec& v, int64_t ld, int64_t off = 0) {  // element (q, j) of a transposed operand
  return [&v, ld, off](int64_t q, int64_t j) { return VB{v[z(j * ld + off + q)], 0.0}; };
}
inline auto exact_n(const Vec& v, int64_t ld, int64_t off = 0) {  // element (q, j) of a plain right operand
  return [&v, ld, off](int64_t q, int64_t j) { return VB{v[z(q * ld + off + j)], 0.0}; };
}

// RoPE on x (rows of ld) at columns off + h*hs + [0, D) for h < nh, in place: forward u' = u c - w s, w' = w c + u s;
// backward (its transpose) the same with -s. Each product rounded, then the add.
void rope(const Calc& k, Val& x, int64_t N, int64_t ld, int64_t off, int64_t nh, int64_t hs,
          const std::vector<int64_t>& pos, const Vec& cs, const Vec& sn, int64_t hh, bool backward) {
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < hh; ++i) {
        const size_t iu = z(t * ld + off + h * hs + i), iw = iu + z(hh), it = z(pos[z(t)] * hh + i);
        const double c = cs[it], s = backward ? -sn[it] : sn[it];
        const double u = x.v[iu], w = x.v[iw], bu = x.b[iu], bw = x.b[iw], fu = x.f[iu], fw = x.f[iw];
        const double p1 = u * c, p2 = w * s, p3 = w * c, p4 = u * s;
        const double b1 = k.mul(u, bu, c, 0), b2 = k.mul(w, bw, s, 0), b3 = k.mul(w, bw, c, 0), b4 = k.mul(u, bu, s, 0);
        x.v[iu] = p1 - p2, x.b[iu] = k.add(p1, b1, -p2, b2), x.m[iu] = std::fabs(p1) + std::fabs(p2);
        x.v[iw] = p3 + p4, x.b[iw] = k.add(p3, b3, p4, b4), x.m[iw] = std::fabs(p3) + std::fabs(p4);
        x.f[iu] = std::fabs(c) * fu + std::fabs(s) * fw, x.f[iw] = std::fabs(c) * fw + std::fabs(s) * fu;
      }
}

struct Rope {
  std::vector<int64_t> pos;
  Vec cs, sn;
  int64_t hh = 0;
};
Rope rope_of(const PrimCase& c) {
  return Rope{ints64(c, "pos"), values(c, "rope.cos"), values(c, "rope.sin"), si(c, "rope.D") / 2};
}

// The bound of an activation a backward op reads (acts.*): the oracle uses the saved values; an implementation may
// recompute them from the op's inputs instead (autograd through the forward), within |saved - exact| plus the
// recomputation's own bound of the exact value.
Vec reread(const Vec& saved, const Val& fwd) {
  Vec b(saved.size());
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::fabs(saved[i] - fwd.v[i]) + fwd.b[i];
  return b;
}

// The bf16 terms of an output (the composite bf16 row, as accept.cpp's add_bf16): k_const u_bf16 f added to the
// bound, u_bf16 rms(f) the floor's bf16 part.
void add_bf16_f(Rule& r, const Vec& f) {
  const Tolerance& t = tolerance("composite", "bf16", "accept");
  for (size_t i = 0; i < r.bound.size(); ++i) r.bound[i] += t.k_const * unit_roundoff("bf16") * f[i];
  r.u_bf16_floor = unit_roundoff("bf16") * rms(f);
}
Rule rule_of(const Val& x, const std::string& acc, bool bf) {
  Rule r = composite(x.b, x.m, acc);
  if (bf) add_bf16_f(r, x.f);
  return r;
}
// An input's values as stored (values() rounds the op's operands under the bf16 policy).
Vec raw(const PrimCase& c, const std::string& name) { return values_as_double(input(c, name)); }

std::pair<int64_t, int64_t> rows_of(const PrimCase& c) {
  const std::vector<int64_t> segs = ints64(c, "segs");
  return segs.empty() ? std::pair<int64_t, int64_t>{0, 0} : std::pair{segs.front(), segs.back()};
}

// ---- attn_qkv_forward ---------------------------------------------------------------------------------------------
// MLA: q = a Wq (d terms); qc_h = [q_nope_h Wuk_h^T (Dn terms, q's bounds), rope(q_rope_h)]; c = a Wdkv (d terms);
// kv_norm: ss = sum c_i^2 (r terms, c's bounds through 2|c|); m = ss / r; s = m + eps (eps rounded too);
// rinv = rsqrt(s) (4 ulps); payload = [(c rinv) g, rope(c_rope), +0 (DSA: the indexer key, not written here)].
// GQA: qc = rope(a Wq) per head; payload = [rope(a Wk) per KV head, a Wv].
// bf16 policy: a and the weights are operands (rounded in the oracle too); inside, q_nope is rounded for the
// absorption GEMM: qc[:, :r]'s bf16 magnitude sum_i |q_nope_i Wuk_h(i)|. Nothing else is rounded (GQA: no term).
struct QkvFwd {
  Val q, qc, c, rinv, payload;
};
QkvFwd qkv_forward(const PrimCase& c, const Calc& k, const model::Config& cfg) {
  const bool bf = c.policy == "bf16";
  const int64_t N = si(c, "N"), d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  const Rope rp = rope_of(c);
  const Vec a = values(c, "a"), wq = values(c, "W.wq");
  QkvFwd f;
  f.payload = Val(z(N * P));
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Kw = cfg.kv_heads * Dh;
    const Vec wk = values(c, "W.wk"), wv = values(c, "W.wv");
    f.qc = prod(N, H * Dh, d, exact_of(a, d), exact_n(wq, H * Dh)).val(k);
    rope(k, f.qc, N, H * Dh, 0, H, Dh, rp.pos, rp.cs, rp.sn, rp.hh, false);
    const Val kk = prod(N, Kw, d, exact_of(a, d), exact_n(wk, Kw)).val(k);
    const Val vv = prod(N, Kw, d, exact_of(a, d), exact_n(wv, Kw)).val(k);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < Kw; ++i) {
        const size_t o = z(t * P + i), o2 = z(t * P + Kw + i), s = z(t * Kw + i);
        f.payload.v[o] = kk.v[s], f.payload.b[o] = kk.b[s], f.payload.m[o] = kk.m[s];
        f.payload.v[o2] = vv.v[s], f.payload.b[o2] = vv.b[s], f.payload.m[o2] = vv.m[s];
      }
    rope(k, f.payload, N, P, 0, cfg.kv_heads, Dh, rp.pos, rp.cs, rp.sn, rp.hh, false);
    return f;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  const Vec wdkv = values(c, "W.wdkv"), g = values(c, "W.kv_norm"), wuk = values(c, "W.wuk");
  f.q = prod(N, Qw, d, exact_of(a, d), exact_n(wq, Qw)).val(k);
  f.qc = Val(z(N * H * Dq));
  for (int64_t h = 0; h < H; ++h) {
    const Val& q = f.q;
    const Prod lat = prod(
        N, r, Dn,
        [&](int64_t t, int64_t i) {
          return r16(VB{q.v[z(t * Qw + h * (Dn + Dr) + i)], q.b[z(t * Qw + h * (Dn + Dr) + i)]}, bf);
        },
        exact_t(wuk, H * Dn, h * Dn));
    const Vec lb = lat.bound(k);
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t i = 0; i < r; ++i) {
        const size_t o = z((t * H + h) * Dq + i), s = z(t * r + i);
        f.qc.v[o] = lat.v[s], f.qc.b[o] = lb[s], f.qc.m[o] = lat.s[s], f.qc.f[o] = lat.f[s];
      }
      for (int64_t i = 0; i < Dr; ++i) {
        const size_t o = z((t * H + h) * Dq + r + i), s = z(t * Qw + h * (Dn + Dr) + Dn + i);
        f.qc.v[o] = q.v[s], f.qc.b[o] = q.b[s];
      }
    }
  }
  rope(k, f.qc, N, H * Dq, r, H, Dq, rp.pos, rp.cs, rp.sn, rp.hh, false);
  f.c = prod(N, Dq, d, exact_of(a, d), exact_n(wdkv, Dq)).val(k);
  f.rinv = Val(z(N));
  const double eps = cfg.norm_eps;
  for (int64_t t = 0; t < N; ++t) {
    double ss = 0, bt = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double x = f.c.v[z(t * Dq + i)];
      ss += x * x, bt += 2 * std::fabs(x) * f.c.b[z(t * Dq + i)];
    }
    const double b_ss = k.sum(static_cast<double>(r), ss, bt);
    const double m = ss / static_cast<double>(r), b_m = b_ss / static_cast<double>(r) + k.rnd(m);
    const double s = m + eps, b_s = b_m + k.rnd(s) + k.rnd(eps);
    const double ri = 1.0 / std::sqrt(s), b_r = k.fn(ri, 0.5 * ri / s, b_s);
    f.rinv.v[z(t)] = ri, f.rinv.b[z(t)] = b_r, f.rinv.m[z(t)] = ri;
    for (int64_t i = 0; i < r; ++i) {
      const double x = f.c.v[z(t * Dq + i)], xr = x * ri, b_xr = k.mul(x, f.c.b[z(t * Dq + i)], ri, b_r);
      const size_t o = z(t * P + i);
      f.payload.v[o] = xr * g[z(i)], f.payload.b[o] = k.mul(xr, b_xr, g[z(i)], 0), f.payload.m[o] = std::fabs(xr * g[z(i)]);
    }
    for (int64_t i = 0; i < Dr; ++i) {
      const size_t o = z(t * P + r + i), s2 = z(t * Dq + r + i);
      f.payload.v[o] = f.c.v[s2], f.payload.b[o] = f.c.b[s2];
    }
  }
  rope(k, f.payload, N, P, r, 1, 0, rp.pos, rp.cs, rp.sn, rp.hh, false);
  return f;
}

Rules qkv_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc, const model::Config& cfg) {
  const QkvFwd f = qkv_forward(c, k, cfg);
  const bool bf = c.policy == "bf16";
  Rules out;
  auto put = [&](const char* name, const Val& x) {
    if (!x.v.empty()) out.emplace(name, rule_of(x, acc, bf));
  };
  put("acts.q", f.q), put("acts.qc", f.qc), put("acts.c", f.c), put("acts.kv_rinv", f.rinv);
  put("acts.payload", f.payload);
  return out;
}

// ---- attn_out_forward / attn_out_backward --------------------------------------------------------------------------
// MLA forward: ocat_h = o_h Wuv_h (r terms); y = ocat Wo (H*Dv terms, ocat's bounds). GQA: y = o Wo (H*Dh terms).
// bf16 policy: acts.o and the weights are operands; ocat is rounded for the Wo GEMM: y's bf16 magnitude
// sum |ocat Wo| (GQA: no term).
Val ocat_of(const Calc& k, const model::Config& cfg, int64_t N, const Vec& o, const Vec& wuv) {
  const int64_t H = cfg.heads, r = cfg.kv_lora_rank, Dv = cfg.v_dim;
  Val x(z(N * H * Dv));
  for (int64_t h = 0; h < H; ++h) {
    const Prod p = prod(N, Dv, r, exact_of(o, H * r, h * r), exact_n(wuv, H * Dv, h * Dv));
    const Vec b = p.bound(k);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t v = 0; v < Dv; ++v) {
        const size_t oi = z(t * H * Dv + h * Dv + v), s = z(t * Dv + v);
        x.v[oi] = p.v[s], x.b[oi] = b[s], x.m[oi] = p.s[s];
      }
  }
  return x;
}

Rules out_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc, const model::Config& cfg) {
  const int64_t N = si(c, "N"), d = cfg.d_model;
  const Vec o = values(c, "acts.o"), wo = values(c, "W.wo");
  Rules out;
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t W = cfg.heads * cfg.head_dim;
    const Val y = prod(N, d, W, exact_of(o, W), exact_n(wo, d)).val(k);
    out.emplace("y", composite(y.b, y.m, acc));
    return out;
  }
  const int64_t W = cfg.heads * cfg.v_dim;
  const bool bf = c.policy == "bf16";
  const Val oc = ocat_of(k, cfg, N, o, values(c, "W.wuv"));
  const Val y = prod(N, d, W, [&](int64_t t, int64_t q) { return r16(VB{oc.v[z(t * W + q)], oc.b[z(t * W + q)]}, bf); },
                     exact_n(wo, d)).val(k);
  out.emplace("acts.ocat", composite(oc.b, oc.m, acc));
  out.emplace("y", rule_of(y, acc, bf));
  return out;
}

// MLA backward: docat = dy Wo^T (d terms); dO_h = docat_h Wuv_h^T (Dv terms, docat's bounds); G.wo = sum over the
// rows of ocat^T dy (ocat: the saved acts.ocat, or recomputed from acts.o: reread); G.wuv_h = sum over the rows of
// o_h^T docat_h. GQA: dO = dy Wo^T (d terms); G.wo = sum over the rows of o^T dy (exact products: a pure sum).
// bf16 policy: dy, acts.o, acts.ocat and the weights are operands (the oracle rounds the saved values); inside, docat
// is rounded for both its GEMMs: dO's bf16 magnitude sum |docat_h Wuv_h|, G.wuv's sum |o_h docat_h|. An ocat
// recomputed from acts.o is rounded at its own value: within the reread bound of the stored ocat, then rounded
// (u_bf16 |ocat|) where the oracle uses the stored value rounded (u_bf16 |ocat| again, the row's k_const 2):
// G.wo's bf16 magnitude sum |ocat dy|. GQA: no term (products of bf16 values are exact in fp32).
Rules out_backward_rules(const PrimCase& c, const Calc& k, const std::string& acc, const model::Config& cfg) {
  const int64_t N = si(c, "N"), d = cfg.d_model, H = cfg.heads;
  const auto [r0, r1] = rows_of(c);
  const int64_t R = r1 - r0;
  const Vec o = values(c, "acts.o"), wo = values(c, "W.wo"), dy = values(c, "dy");
  Rules out;
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t W = H * cfg.head_dim;
    const Val dO = prod(N, W, d, exact_of(dy, d), exact_t(wo, d)).val(k);
    const Prod gw = prod(W, d, R, exact_t(o, W, r0 * W), exact_n(dy, d, r0 * d));
    out.emplace("dO", composite(dO.b, dO.m, acc));
    out.emplace("G.wo", sum_rule(gw.s, static_cast<double>(R), acc));
    return out;
  }
  const int64_t r = cfg.kv_lora_rank, Dv = cfg.v_dim, W = H * Dv;
  const bool bf = c.policy == "bf16";
  const Vec wuv = values(c, "W.wuv"), ocat = values(c, "acts.ocat");
  const Val dc = prod(N, W, d, exact_of(dy, d), exact_t(wo, d)).val(k);
  Val dO(z(N * H * r));
  for (int64_t h = 0; h < H; ++h) {
    const Prod p = prod(
        N, r, Dv,
        [&](int64_t t, int64_t v) { return r16(VB{dc.v[z(t * W + h * Dv + v)], dc.b[z(t * W + h * Dv + v)]}, bf); },
        exact_t(wuv, W, h * Dv));
    const Vec b = p.bound(k);
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < r; ++i) {
        const size_t oi = z(t * H * r + h * r + i), s = z(t * r + i);
        dO.v[oi] = p.v[s], dO.b[oi] = b[s], dO.m[oi] = p.s[s], dO.f[oi] = p.f[s];
      }
  }
  const Vec b_oc = reread(raw(c, "acts.ocat"), ocat_of(k, cfg, N, o, wuv));  // |recomputed - stored|
  const Val gwo = prod(
      W, d, R, [&](int64_t i, int64_t q) { return r16(VB{ocat[z((r0 + q) * W + i)], b_oc[z((r0 + q) * W + i)]}, bf); },
      exact_n(dy, d, r0 * d)).val(k);
  Val gwuv(z(r * W));
  for (int64_t h = 0; h < H; ++h) {
    const Prod p = prod(r, Dv, R, [&](int64_t i, int64_t q) { return VB{o[z((r0 + q) * H * r + h * r + i)], 0.0}; },
                        [&](int64_t q, int64_t v) {
                          return r16(VB{dc.v[z((r0 + q) * W + h * Dv + v)], dc.b[z((r0 + q) * W + h * Dv + v)]}, bf);
                        });
    const Vec b = p.bound(k);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t v = 0; v < Dv; ++v) {
        const size_t oi = z(i * W + h * Dv + v), s = z(i * Dv + v);
        gwuv.v[oi] = p.v[s], gwuv.b[oi] = b[s], gwuv.m[oi] = p.s[s], gwuv.f[oi] = p.f[s];
      }
  }
  out.emplace("dO", rule_of(dO, acc, bf));
  out.emplace("G.wo", rule_of(gwo, acc, bf));
  out.emplace("G.wuv", rule_of(gwuv, acc, bf));
  return out;
}

// ---- attn_qkv_backward -------------------------------------------------------------------------------------------
// MLA: dq_nope_h = dqc_h[:, :r] Wuk_h (r terms); dq_rope_h = rope^T(dqc_h[:, r:]); the kv_norm backward on the saved
// c and rinv (each reread): xh = c rinv, dxh = dpay g, cs = sum dxh xh (r terms), cc = cs / r, dc = rinv (dxh - xh cc);
// dc_rope = rope^T(dpay[:, r:]); da = dq Wq^T + dc Wdkv^T (one sum of Qw + Dq terms); G.wq = sum over the rows of
// a^T dq, G.wdkv of a^T dc, G.kv_norm of dpay xh, G.wuk_h of dqc_h[:, :r]^T q_nope_h (q reread).
// GQA: dq = rope^T(dqc), dk = rope^T(dpay_k), dv = dpay_v; da = dq Wq^T + dk Wk^T + dv Wv^T (one sum);
// G.wq, G.wk over the rows; G.wv = sum over the rows of a^T dv (exact products: a pure sum).
// bf16 policy: a, the weights and acts.q are operands (the oracle rounds them). dqc and dpayload are not: the
// reference rounds dqc[:, :r] (MLA: dq_nope's GEMM, G.wuk) and dpayload's value columns (GQA: G.wv, da) but passes
// the rope columns through RoPE unrounded, so the oracle leaves them unrounded and each such rounding is a bf16 term
// (|dqc Wuk| in dq_nope, |dqc q| in G.wuk; |dv Wv| in da, |a dv| in G.wv). Inside, dq and dc (GQA: dq, dk) are
// rounded for the da GEMMs and the weight gradients: |dq Wq| + |dc Wdkv| in da, |a dq| in G.wq, |a dc| in G.wdkv,
// dq_nope's own bf16 magnitude carried through (times |Wq|, |a|). A q_nope recomputed from a is rounded at its own
// value (the reread, as acts.ocat in attn_out_backward): |dqc q| again in G.wuk. G.kv_norm: no bf16 rounding (the
// kv_norm backward is fp32 on fp32 values).
Rules qkv_backward_rules(const PrimCase& c, const Calc& k, const std::string& acc, const model::Config& cfg) {
  const int64_t N = si(c, "N"), d = cfg.d_model, H = cfg.heads, P = cfg.payload_dim();
  const auto [r0, r1] = rows_of(c);
  const int64_t R = r1 - r0;
  const Rope rp = rope_of(c);
  const Vec a = values(c, "a"), wq = values(c, "W.wq"), dqc = values(c, "dqc"), dpay = values(c, "dpayload");
  const bool bf = c.policy == "bf16";
  // an intermediate (or a rounded column of an input) as a GEMM operand: rounded under bf16
  auto val_of = [bf](const Val& x, int64_t ld, int64_t off) {
    return [&x, ld, off, bf](int64_t q, int64_t j) {
      const size_t o = z(q * ld + off + j);
      return r16(VB{x.v[o], x.b[o], x.f[o]}, bf);
    };
  };
  auto in_of = [bf](const Vec& v, int64_t ld, int64_t off) {  // element (i, q) of a left operand, input
    return [&v, ld, off, bf](int64_t i, int64_t q) { return r16(VB{v[z(i * ld + off + q)], 0.0}, bf); };
  };
  Rules out;
  auto grad = [&](const char* name, const Val& dx, int64_t w) {  // G = sum over the rows of a^T dx, dx (N, w)
    const Val g = prod(d, w, R, exact_t(a, d, r0 * d), val_of(dx, w, r0 * w)).val(k);
    out.emplace(name, rule_of(g, acc, bf));
  };
  if (cfg.attn == model::AttnKind::gqa) {
    const int64_t Dh = cfg.head_dim, Kw = cfg.kv_heads * Dh;
    const Vec wk = values(c, "W.wk"), wv = values(c, "W.wv");
    Val dq(z(N * H * Dh)), dk(z(N * Kw));
    dq.v = dqc;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t i = 0; i < Kw; ++i) dk.v[z(t * Kw + i)] = dpay[z(t * P + i)];
    rope(k, dq, N, H * Dh, 0, H, Dh, rp.pos, rp.cs, rp.sn, rp.hh, true);
    rope(k, dk, N, Kw, 0, cfg.kv_heads, Dh, rp.pos, rp.cs, rp.sn, rp.hh, true);
    const Prod p1 = prod(N, d, H * Dh, val_of(dq, H * Dh, 0), exact_t(wq, H * Dh));
    const Prod p2 = prod(N, d, Kw, val_of(dk, Kw, 0), exact_t(wk, Kw));
    const Prod p3 = prod(N, d, Kw, in_of(dpay, P, Kw), exact_t(wv, Kw));
    const Val da = fused(k, {&p1, &p2, &p3});
    out.emplace("da", rule_of(da, acc, bf));
    grad("G.wq", dq, H * Dh);
    grad("G.wk", dk, Kw);
    const Prod gv = prod(d, Kw, R, exact_t(a, d, r0 * d), exact_n(dpay, P, r0 * P + Kw));
    Rule rv = sum_rule(gv.s, static_cast<double>(R), acc);
    if (bf) add_bf16_f(rv, gv.s);  // dv rounded: u_bf16 |a dv| per term
    out.emplace("G.wv", std::move(rv));
    return out;
  }
  const int64_t Dn = cfg.nope_dim, Dr = cfg.rope_dim, r = cfg.kv_lora_rank, Qw = H * (Dn + Dr), Dq = r + Dr;
  const Vec wdkv = values(c, "W.wdkv"), g = values(c, "W.kv_norm"), wuk = values(c, "W.wuk");
  const Vec q_in = values(c, "acts.q"), c_in = values(c, "acts.c"), ri_in = values(c, "acts.kv_rinv");
  const QkvFwd f = qkv_forward(c, k, cfg);
  const Vec b_q = reread(raw(c, "acts.q"), f.q), b_c = reread(c_in, f.c), b_ri = reread(ri_in, f.rinv);
  Val dq(z(N * Qw));
  for (int64_t h = 0; h < H; ++h) {
    const Prod p = prod(N, Dn, r, in_of(dqc, H * Dq, h * Dq), exact_n(wuk, H * Dn, h * Dn));
    const Vec b = p.bound(k);
    for (int64_t t = 0; t < N; ++t) {
      for (int64_t i = 0; i < Dn; ++i) {
        const size_t o = z(t * Qw + h * (Dn + Dr) + i), s = z(t * Dn + i);
        dq.v[o] = p.v[s], dq.b[o] = b[s], dq.m[o] = p.s[s], dq.f[o] = p.f[s];
      }
      for (int64_t i = 0; i < Dr; ++i) dq.v[z(t * Qw + h * (Dn + Dr) + Dn + i)] = dqc[z((t * H + h) * Dq + r + i)];
    }
  }
  rope(k, dq, N, Qw, Dn, H, Dn + Dr, rp.pos, rp.cs, rp.sn, rp.hh, true);
  Val dc(z(N * Dq)), xh(z(N * r));
  for (int64_t t = 0; t < N; ++t) {
    const double ri = ri_in[z(t)], bri = b_ri[z(t)];
    double cs = 0, s = 0, bt = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double x = c_in[z(t * Dq + i)], xv = x * ri, dxh = dpay[z(t * P + i)] * g[z(i)];
      const size_t o = z(t * r + i);
      xh.v[o] = xv, xh.b[o] = k.mul(x, b_c[z(t * Dq + i)], ri, bri);
      cs += dxh * xv, s += std::fabs(dxh * xv), bt += std::fabs(dxh) * xh.b[o] + std::fabs(xv) * k.rnd(dxh);
    }
    const double b_sum = k.sum(static_cast<double>(r), s, bt);
    const double cc = cs / static_cast<double>(r), b_cc = b_sum / static_cast<double>(r) + k.rnd(cc);
    for (int64_t i = 0; i < r; ++i) {
      const size_t o = z(t * r + i);
      const double dxh = dpay[z(t * P + i)] * g[z(i)], tt = xh.v[o] * cc, b_t = k.mul(xh.v[o], xh.b[o], cc, b_cc);
      const double e = dxh - tt, b_e = k.add(dxh, k.rnd(dxh), -tt, b_t);
      dc.v[z(t * Dq + i)] = ri * e, dc.b[z(t * Dq + i)] = k.mul(ri, bri, e, b_e);
      dc.m[z(t * Dq + i)] = std::fabs(ri) * (std::fabs(dxh) + std::fabs(tt));
    }
    for (int64_t i = 0; i < Dr; ++i) dc.v[z(t * Dq + r + i)] = dpay[z(t * P + r + i)];
  }
  rope(k, dc, N, Dq, r, 1, 0, rp.pos, rp.cs, rp.sn, rp.hh, true);
  const Prod p1 = prod(N, d, Qw, val_of(dq, Qw, 0), exact_t(wq, Qw));
  const Prod p2 = prod(N, d, Dq, val_of(dc, Dq, 0), exact_t(wdkv, Dq));
  const Val da = fused(k, {&p1, &p2});
  out.emplace("da", rule_of(da, acc, bf));
  grad("G.wq", dq, Qw);
  grad("G.wdkv", dc, Dq);
  // G.kv_norm[i] = sum over the rows of dpay[t, i] xh[t, i]
  const Val gn = prod(1, r, R, [](int64_t, int64_t) { return VB{1.0, 0.0}; }, [&](int64_t q, int64_t i) {
                   const size_t o = z((r0 + q) * r + i);
                   const double dy = dpay[z((r0 + q) * P + i)];
                   return VB{dy * xh.v[o], std::fabs(dy) * xh.b[o]};
                 }).val(k);
  out.emplace("G.kv_norm", composite(gn.b, gn.m, acc));
  Val gwuk(z(r * H * Dn));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t off = r0 * H * Dq + h * Dq;
    const Prod p = prod(
        r, Dn, R, [&](int64_t i, int64_t q) { return r16(VB{dqc[z(q * H * Dq + off + i)], 0.0}, bf); },
        [&](int64_t q, int64_t i) {
          const size_t o = z((r0 + q) * Qw + h * (Dn + Dr) + i);
          return r16(VB{q_in[o], b_q[o]}, bf);
        });
    const Vec b = p.bound(k);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < Dn; ++j) {
        const size_t o = z(i * H * Dn + h * Dn + j), s = z(i * Dn + j);
        gwuk.v[o] = p.v[s], gwuk.b[o] = b[s], gwuk.m[o] = p.s[s], gwuk.f[o] = p.f[s];
      }
  }
  out.emplace("G.wuk", rule_of(gwuk, acc, bf));
  return out;
}


// ---- DSA core ----------------------------------------------------------------------------------------------------
// One query's selected keys (sel[r][0..n), up to the first -1) and the two softmaxes the indexer loss compares, in fp64
// with first-order bounds:
//   attention, per head h: s_j = (q_h . k_j) scale (Dq terms; the product and scale's own rounding to T: 2 roundings);
//     e_j = exp(s_j - m) (the subtraction's rounding, 4 ulps), l = sum e_j (n terms), p_j = e_j / l (4 ulps). The max
//     m's own error does not count: p is invariant under any shift m' of the scores (only the rounding of s_j - m
//     depends on it). pbar_j = (sum_h p_j^h) / H (H terms, the division's rounding).
//   indexer: z_tj = iq_t . k_j[ikey..] (Di terms); relu(z) within b_z (1-Lipschitz; 0 where z < -b_z);
//     I_j = sum_t w_t relu(z_tj) (Hi terms); eI_j = exp(I_j - mI), lI = sum eI_j, qI_j = eI_j / lI as for p (mI's
//     error cancels likewise); lq_j = (I_j - mI) - log(lI) (two roundings, log within 4 ulps of its value).
// bf16 policy: q and kv are operands (rounded in the oracle too); iq is not: the reference rounds its Hi query
// vectors for the indexer dot products but not its Hi weights, so the oracle leaves iq unrounded and z_tj carries
// the bf16 magnitude f_z = sum_c |iq_t[c] k_j[c]|, propagated: relu (f_rz = f_z where z >= -(b_z + u_bf16 f_z)),
// f_I = sum_t |w_t| f_rz, f_eI = eI f_I, f_lI = sum f_eI, f_qI = f_eI / lI + eI f_lI / lI^2, f_lq = f_I + f_lI / lI.
// p (and so pbar) is computed from the rounded operands without a rounding inside: no bf16 term.
// The selected keys' payload rows, compacted (row i = key keys[i]): the attention core over them is the dense core
// with keys 0..n-1 (golden/primitives/bounds.h's magnitudes apply as they are, with the key set restricted).
Vec compact(const Vec& kv, const std::vector<int64_t>& keys, int64_t P) {
  Vec out;
  for (int64_t j : keys) out.insert(out.end(), kv.begin() + j * P, kv.begin() + (j + 1) * P);
  return out;
}

struct DsaRow {
  std::vector<int64_t> keys;
  Vec kr;                      // the selected keys' payload rows, packed (n, P): the core's bounds run on them
  Vec pbar, b_pbar;            // (n)
  Vec z, b_z, rz, b_rz;        // (n * Hi)
  Vec I, qI, b_qI, lq, b_lq;   // (n)
  Vec f_z, f_rz, f_qI, f_lq;   // the bf16 magnitudes (zero unless bf16)
};
// The core's dims with the DSA indexer's (Hi, Di, topk, ikey).
model::CoreDims dsa_dims(const PrimCase& c) {
  model::CoreDims cd = core_dims(c);
  cd.Hi = si(c, "Hi"), cd.Di = si(c, "Di"), cd.topk = si(c, "topk"), cd.ikey = si(c, "ikey");
  return cd;
}
DsaRow dsa_row(const Calc& k, const model::CoreDims& cd, const Vec& q, const Vec& iq, const Vec& kv,
               const std::vector<int32_t>& sel, int64_t r, bool bf) {
  const double u16 = unit_roundoff("bf16");
  DsaRow w;
  for (int64_t i = 0; i < cd.topk && sel[z(r * cd.topk + i)] >= 0; ++i) w.keys.push_back(sel[z(r * cd.topk + i)]);
  w.kr = compact(kv, w.keys, cd.P);
  const int64_t n = static_cast<int64_t>(w.keys.size()), H = cd.H, Dq = cd.Dq, P = cd.P, hpg = cd.H / cd.G;
  const int64_t Hi = cd.Hi, Di = cd.Di, Iw = Hi * Di + Hi;
  const double nn = static_cast<double>(n);
  w.pbar.assign(z(n), 0.0), w.b_pbar = w.pbar;
  Vec psum(z(n), 0.0), pb(z(n), 0.0), s(z(n)), bs(z(n)), e(z(n)), be(z(n));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / hpg;
    double m = 0;
    for (int64_t i = 0; i < n; ++i) {
      double dot = 0, sa = 0;
      for (int64_t c = 0; c < Dq; ++c) {
        const double t = q[z((r * H + h) * Dq + c)] * kv[z(w.keys[z(i)] * P + g * Dq + c)];
        dot += t, sa += std::fabs(t);
      }
      s[z(i)] = dot * cd.scale;
      bs[z(i)] = k.sum(static_cast<double>(Dq), sa, 0.0) * std::fabs(cd.scale) + 2 * k.rnd(s[z(i)]);
      m = i == 0 ? s[z(i)] : std::max(m, s[z(i)]);
    }
    double l = 0, bt = 0;
    for (int64_t i = 0; i < n; ++i) {
      e[z(i)] = std::exp(s[z(i)] - m);
      be[z(i)] = e[z(i)] * (bs[z(i)] + k.rnd(s[z(i)] - m)) + k.phi * k.rnd(e[z(i)]);
      l += e[z(i)], bt += be[z(i)];
    }
    const double bl = k.sum(nn, l, bt);
    for (int64_t i = 0; i < n; ++i) psum[z(i)] += e[z(i)] / l, pb[z(i)] += k.div(e[z(i)], be[z(i)], l, bl);
  }
  for (int64_t i = 0; i < n; ++i) {
    w.pbar[z(i)] = psum[z(i)] / static_cast<double>(H);
    w.b_pbar[z(i)] = k.sum(static_cast<double>(H), psum[z(i)], pb[z(i)]) / static_cast<double>(H) + k.rnd(w.pbar[z(i)]);
  }
  w.z.assign(z(n * Hi), 0.0), w.b_z = w.z, w.rz = w.z, w.b_rz = w.z, w.f_z = w.z, w.f_rz = w.z;
  w.I.assign(z(n), 0.0), w.qI = w.I, w.b_qI = w.I, w.lq = w.I, w.b_lq = w.I, w.f_qI = w.I, w.f_lq = w.I;
  Vec bI(z(n)), fI(z(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double I = 0, Ia = 0, bt = 0;
    for (int64_t t = 0; t < Hi; ++t) {
      double dot = 0, sa = 0;
      for (int64_t c = 0; c < Di; ++c) {
        const double x = iq[z(r * Iw + t * Di + c)] * kv[z(w.keys[z(i)] * P + cd.ikey + c)];
        dot += x, sa += std::fabs(x);
      }
      const size_t o = z(i * Hi + t);
      w.z[o] = dot, w.b_z[o] = k.sum(static_cast<double>(Di), sa, 0.0), w.f_z[o] = bf ? sa : 0.0;
      const bool on = dot >= -(w.b_z[o] + u16 * w.f_z[o]);
      w.rz[o] = std::max(dot, 0.0), w.b_rz[o] = on ? w.b_z[o] : 0.0, w.f_rz[o] = on ? w.f_z[o] : 0.0;
      const double wt = iq[z(r * Iw + Hi * Di + t)];
      I += wt * w.rz[o], Ia += std::fabs(wt * w.rz[o]), bt += std::fabs(wt) * w.b_rz[o];
      fI[z(i)] += std::fabs(wt) * w.f_rz[o];
    }
    w.I[z(i)] = I, bI[z(i)] = k.sum(static_cast<double>(Hi), Ia, bt);
  }
  double mI = 0;
  for (int64_t i = 0; i < n; ++i) mI = i == 0 ? w.I[z(i)] : std::max(mI, w.I[z(i)]);
  double lI = 0, bt = 0, flI = 0;
  for (int64_t i = 0; i < n; ++i) {
    e[z(i)] = std::exp(w.I[z(i)] - mI);
    be[z(i)] = e[z(i)] * (bI[z(i)] + k.rnd(w.I[z(i)] - mI)) + k.phi * k.rnd(e[z(i)]);
    lI += e[z(i)], bt += be[z(i)], flI += e[z(i)] * fI[z(i)];
  }
  const double blI = k.sum(nn, lI, bt), lg = std::log(lI), b_lg = k.fn(lg, 1.0 / lI, blI);
  for (int64_t i = 0; i < n; ++i) {
    w.qI[z(i)] = e[z(i)] / lI, w.b_qI[z(i)] = k.div(e[z(i)], be[z(i)], lI, blI);
    w.f_qI[z(i)] = e[z(i)] * fI[z(i)] / lI + e[z(i)] * flI / (lI * lI);
    w.f_lq[z(i)] = fI[z(i)] + flI / lI;
    const double dI = w.I[z(i)] - mI, b_dI = bI[z(i)] + k.rnd(dI);
    w.lq[z(i)] = dI - lg, w.b_lq[z(i)] = k.add(dI, b_dI, -lg, b_lg);
  }
  return w;
}

// dsa_core_forward: o and stats as the attention core over the selected keys (the attn_core row, bounds.h's
// magnitudes with keys = the selection); ikl = sum_j t_j, t_j = pbar_j (log pbar_j - lq_j) (pbar_j > 0): log within
// 4 ulps of its value (its argument's bound through 1/pbar), the difference's and the product's roundings, n terms.
// bf16 policy: o's bf16 magnitude is the attention core's (p rounded for the value GEMM: sum_j p_j |v_j|, bounds.h);
// stats none; ikl's sum_j pbar_j f_lq_j (the indexer's, dsa_row).
Rules dsa_forward_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const bool bf = c.policy == "bf16";
  const model::CoreDims cd = dsa_dims(c);
  const int64_t Nq = si(c, "Nq"), H = cd.H, Dq = cd.Dq, Dv = cd.Dv;
  const Vec q = values(c, "q"), iq = values(c, "iq"), kv = values(c, "kv");
  const std::vector<int32_t> sel = values_i32(input(c, "sel"));
  ElemBounds eo("attn_core", Nq * H * Dv, bf), es("attn_core", Nq * H * 2);
  Vec bk(z(Nq), 0.0), mk = bk, fk = bk;
  for (int64_t r = 0; r < Nq; ++r) {
    const DsaRow w = dsa_row(k, cd, q, iq, kv, sel, r, bf);
    const int64_t n = static_cast<int64_t>(w.keys.size());
    if (n == 0) continue;
    const Vec& kr = w.kr;
    const int64_t qp = n - 1;
    const AttnFwdBounds b = attn_forward_bounds(cd, bf, q.data() + r * H * Dq, &qp, nullptr, 1, kr.data());
    std::copy(b.o.sum_abs.begin(), b.o.sum_abs.end(), eo.sum_abs.begin() + r * H * Dv);
    if (bf) std::copy(b.o.sum_abs_bf16.begin(), b.o.sum_abs_bf16.end(), eo.sum_abs_bf16.begin() + r * H * Dv);
    std::copy(b.o.n_terms.begin(), b.o.n_terms.end(), eo.n_terms.begin() + r * H * Dv);
    std::copy(b.stats.sum_abs.begin(), b.stats.sum_abs.end(), es.sum_abs.begin() + r * H * 2);
    std::copy(b.stats.n_terms.begin(), b.stats.n_terms.end(), es.n_terms.begin() + r * H * 2);
    double sa = 0, bt = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double p = w.pbar[z(i)], bp = w.b_pbar[z(i)];
      if (!(p > 0)) continue;
      const double lp = std::log(p), b_lp = k.fn(lp, 1.0 / p, bp);
      const double df = lp - w.lq[z(i)], b_df = k.add(lp, b_lp, -w.lq[z(i)], w.b_lq[z(i)]);
      sa += std::fabs(p * df), bt += k.mul(p, bp, df, b_df);
      fk[z(r)] += p * w.f_lq[z(i)];
    }
    bk[z(r)] = k.sum(static_cast<double>(n), sa, bt), mk[z(r)] = sa;
  }
  Rules out;
  out.emplace("o", from_elem(eo, acc));
  out.emplace("stats", from_elem(es, acc));
  Rule rk = composite(bk, mk, acc);
  if (bf) add_bf16_f(rk, fk);
  out.emplace("ikl", std::move(rk));
  return out;
}

// dsa_core_backward: dq and the attention columns of dkv as the attention core's backward over the selected keys
// (the attn_core row, bounds.h's magnitudes per query with the key set restricted; dkv's count: 2 H terms per
// query selecting the key + Dq + Dv + 1). The indexer, composite: dI_j = (qI_j - pbar_j) iscale, where an
// implementation by autograd of the KL computes qI_j sum_k pbar_k - pbar_j (sum_k pbar_k = 1 exactly, its computed
// value within the pbar bounds and the n-term sum's rounding: qI_j times that, and the product's rounding);
// dw_t = sum_j dI_j relu(z_tj) (n terms); dz_tj = dI_j w_t where z_tj > 0 (where |z| <= b_z the other side of the
// ReLU may be taken: + |dI w|); diq_t = sum_j dz_tj k_j (n terms); dkv[j][ikey + c] = sum over the (query, indexer
// head) pairs selecting j of dz_tj iq_t[c].
// bf16 policy: dq and dkv's attention columns carry the attention core's bf16 magnitudes (bounds.h: p and ds
// rounded, dO rounded for dp and the value gradient, with the key set restricted). The indexer: f_dI = f_qI iscale;
// dw_t: sum_j f_dI |relu z| + |dI| f_rz; dz rounded for the diq and dkv GEMMs: f_dz = |w| f_dI + |dz|; diq_t: sum_j
// f_dz |k_j|; dkv's indexer columns: sum f_dz |iq_t| + |dz iq_t| (iq's query columns rounded there, not in the
// oracle). The ReLU's ambiguous band is |z| <= b_z + u_bf16 f_z.
Rules dsa_backward_rules(const PrimCase& c, const Calc& k, const std::string& acc) {
  const bool bf = c.policy == "bf16";
  const double u16 = unit_roundoff("bf16");
  const model::CoreDims cd = dsa_dims(c);
  const int64_t Nq = si(c, "Nq"), S = si(c, "S"), H = cd.H, Dq = cd.Dq, Dv = cd.Dv, P = cd.P;
  const int64_t Hi = cd.Hi, Di = cd.Di, Iw = Hi * Di + Hi;
  const double iscale = sf(c, "iscale");
  const Vec q = values(c, "q"), iq = values(c, "iq"), kv = values(c, "kv"), o = values(c, "o"),
            st = values(c, "stats"), dO = values(c, "dO");
  const std::vector<int32_t> sel = values_i32(input(c, "sel"));
  ElemBounds edq("attn_core", Nq * H * Dq, bf), ekv("attn_core", S * P, bf);
  Vec cnt(z(S), 0.0);
  Vec bdiq(z(Nq * Iw), 0.0), mdiq = bdiq, fdiq = bdiq, skv(z(S * Di), 0.0), btkv = skv, fkv = skv;
  const std::vector<int64_t> one = {0, 1};
  for (int64_t r = 0; r < Nq; ++r) {
    const DsaRow w = dsa_row(k, cd, q, iq, kv, sel, r, bf);
    const int64_t n = static_cast<int64_t>(w.keys.size());
    if (n == 0) continue;
    const Vec& kr = w.kr;
    const int64_t qp = n - 1;
    const AttnBwdBounds b = attn_backward_bounds(cd, bf, q.data() + r * H * Dq, &qp, nullptr, 1, kr.data(), n,
                                                 o.data() + r * H * Dv, st.data() + r * H * 2, dO.data() + r * H * Dv,
                                                 one);
    std::copy(b.dq.sum_abs.begin(), b.dq.sum_abs.end(), edq.sum_abs.begin() + r * H * Dq);
    std::copy(b.dq.n_terms.begin(), b.dq.n_terms.end(), edq.n_terms.begin() + r * H * Dq);
    if (bf) std::copy(b.dq.sum_abs_bf16.begin(), b.dq.sum_abs_bf16.end(), edq.sum_abs_bf16.begin() + r * H * Dq);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = w.keys[z(i)];
      cnt[z(j)] += 1;
      for (int64_t cc = 0; cc < P; ++cc) ekv.sum_abs[z(j * P + cc)] += b.dkv.sum_abs[z(i * P + cc)];
      if (bf)
        for (int64_t cc = 0; cc < P; ++cc) ekv.sum_abs_bf16[z(j * P + cc)] += b.dkv.sum_abs_bf16[z(i * P + cc)];
    }
    // the indexer
    double sp = 0, bsp = 0;
    for (int64_t i = 0; i < n; ++i) sp += w.pbar[z(i)], bsp += w.b_pbar[z(i)];
    const double b_sum = k.sum(static_cast<double>(n), sp, bsp);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = w.keys[z(i)];
      const double qi = w.qI[z(i)], p = w.pbar[z(i)];
      const double df = qi - p, b_df = k.add(qi, w.b_qI[z(i)], -p, w.b_pbar[z(i)]) + qi * b_sum + k.rnd(qi);
      const double dI = df * iscale, b_dI = k.mul(df, b_df, iscale, 0), f_dI = w.f_qI[z(i)] * std::fabs(iscale);
      for (int64_t t = 0; t < Hi; ++t) {
        const size_t o2 = z(i * Hi + t);
        const double zt = w.z[o2], wt = iq[z(r * Iw + Hi * Di + t)];
        // dw_t
        const size_t ow = z(r * Iw + Hi * Di + t);
        mdiq[ow] += std::fabs(dI * w.rz[o2]), bdiq[ow] += k.mul(dI, b_dI, w.rz[o2], w.b_rz[o2]);
        fdiq[ow] += f_dI * w.rz[o2] + std::fabs(dI) * w.f_rz[o2];
        // dz_tj
        const double dz = zt > 0 ? dI * wt : 0.0;
        double b_dz = zt > 0 ? k.mul(dI, b_dI, wt, 0) : 0.0;
        const bool band = std::fabs(zt) <= w.b_z[o2] + u16 * w.f_z[o2];
        if (band) b_dz = k.mul(dI, b_dI, wt, 0) + std::fabs(dI * wt);
        const double f_dz = bf && (zt > 0 || band) ? std::fabs(wt) * f_dI + std::fabs(dI * wt) : 0.0;
        for (int64_t cc = 0; cc < Di; ++cc) {
          const double kj = kv[z(j * P + cd.ikey + cc)], it = iq[z(r * Iw + t * Di + cc)];
          const size_t oq = z(r * Iw + t * Di + cc), ok = z(j * Di + cc);
          mdiq[oq] += std::fabs(dz * kj), bdiq[oq] += b_dz * std::fabs(kj), fdiq[oq] += f_dz * std::fabs(kj);
          skv[ok] += std::fabs(dz * it), btkv[ok] += b_dz * std::fabs(it);
          if (bf) fkv[ok] += f_dz * std::fabs(it) + std::fabs(dz * it);
        }
      }
    }
    for (int64_t x = 0; x < Iw; ++x) {
      const size_t o2 = z(r * Iw + x);
      bdiq[o2] = k.sum(static_cast<double>(n), mdiq[o2], bdiq[o2]);
    }
  }
  for (int64_t j = 0; j < S; ++j)
    for (int64_t cc = 0; cc < P; ++cc) ekv.n_terms[z(j * P + cc)] = 2 * H * cnt[z(j)] + static_cast<double>(Dq + Dv + 1);
  Rule rkv = from_elem(ekv, acc);
  Vec bi(z(S * P), 0.0), mi = bi;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t cc = 0; cc < Di; ++cc) {
      const size_t ok = z(j * Di + cc), o2 = z(j * P + cd.ikey + cc);
      bi[o2] = k.sum(Hi * cnt[z(j)], skv[ok], btkv[ok]), mi[o2] = skv[ok];
    }
  const Rule ri = composite(bi, mi, acc);
  for (size_t x = 0; x < rkv.bound.size(); ++x) rkv.bound[x] += ri.bound[x], rkv.mag[x] += ri.mag[x];
  if (bf) {  // the indexer columns' bf16 terms (the composite bf16 row), and the floor of all the bf16 magnitudes
    Vec fi(z(S * P), 0.0);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t cc = 0; cc < Di; ++cc) fi[z(j * P + cd.ikey + cc)] = fkv[z(j * Di + cc)];
    Rule rf{"composite", Vec(z(S * P), 0.0), {}, 0.0};
    add_bf16_f(rf, fi);
    Vec fall = ekv.sum_abs_bf16;
    for (size_t x = 0; x < fall.size(); ++x) rkv.bound[x] += rf.bound[x], fall[x] += fi[x];
    rkv.u_bf16_floor = u16 * rms(fall);
  }
  Rules out;
  out.emplace("dq", from_elem(edq, acc));
  out.emplace("dkv", std::move(rkv));
  Rule rd = composite(bdiq, mdiq, acc);
  if (bf) add_bf16_f(rd, fdiq);
  out.emplace("diq", std::move(rd));
  return out;
}

}  // namespace

Rules attn_rules(const PrimCase& c, const Calc& k, const std::string& acc, const std::vector<NamedTensor>& ref) {
  (void)ref;
  const std::string& op = c.op;
  if (op == "attn_qkv_forward" || op == "attn_qkv_backward" || op == "attn_out_forward" || op == "attn_out_backward") {
    const model::Config cfg = model::Config::from_json(c.shapes.at("config"));
    if (op == "attn_qkv_forward") return qkv_forward_rules(c, k, acc, cfg);
    if (op == "attn_qkv_backward") return qkv_backward_rules(c, k, acc, cfg);
    if (op == "attn_out_forward") return out_forward_rules(c, k, acc, cfg);
    return out_backward_rules(c, k, acc, cfg);
  }
  if (op == "dsa_core_forward") return dsa_forward_rules(c, k, acc);
  if (op == "dsa_core_backward") return dsa_backward_rules(c, k, acc);
  return {};
}

}  // namespace trident::golden::accept_detail
