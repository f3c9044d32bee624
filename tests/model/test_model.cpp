// Reference model: recompute vs stored (bitwise, all policies), determinism (runs, threads), batch
// invariance, token-chunk invariance, all-ignored batch, MLA absorbed form vs the direct form, training sanity.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "reference/model/attention.h"
#include "reference/model/model.h"
#include "reference/model/train.h"
#include "reference/tolerances.h"

using namespace trident;
using namespace trident::model;

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
double norm2(const ParamSet<T>& p) {
  double s = 0;
  for (const auto& t : p.t)
    for (T x : t.data) s += static_cast<double>(x) * static_cast<double>(x);
  return s;
}

// First differing parameter (or "" when all bits are equal).
template <class T>
std::string first_diff(const ParamSet<T>& a, const ParamSet<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a.t[i].data, b.t[i].data)) return a.info[i].name;
  return "";
}

Batch random_batch(const Config& c, int64_t B, int64_t S, uint64_t seed, bool some_ignored = true) {
  Batch b;
  b.B = B;
  b.S = S;
  for (int64_t i = 0; i < B * S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(hash3(seed, 1, static_cast<uint64_t>(i)) % static_cast<uint64_t>(c.vocab)));
    b.targets.push_back(some_ignored && i % 5 == 2 ? -100
                                                   : static_cast<int32_t>(hash3(seed, 2, static_cast<uint64_t>(i)) %
                                                                          static_cast<uint64_t>(c.vocab)));
  }
  return b;
}

template <class T>
struct FB {
  ForwardResult<T> fr;
  ParamSet<T> g;
};
template <class T>
FB<T> fwd_bwd(const Config& c, const ParamSet<T>& p, const Batch& b, StepOptions opt) {
  GradAcc<T> acc = GradAcc<T>::zeros(p.info);
  FB<T> out;
  out.fr = model_forward_backward<T>(c, p, b, opt, acc);
  out.g = ParamSet<T>::zeros(c);
  acc.finalize(out.g);
  return out;
}

template <class T>
void recompute_case(const std::string& preset, Policy pol) {
  Config c = Config::preset(preset);
  c.policy = pol;
  const uint64_t seed = 11;
  const auto p = ParamSet<T>::init(c, seed);
  const Batch b = random_batch(c, 2, 13, seed);  // tile 8: 8 + 5 per sequence
  StepOptions a, r;
  a.token_chunk = r.token_chunk = 16;
  r.recompute = true;
  const FB<T> x = fwd_bwd<T>(c, p, b, a), y = fwd_bwd<T>(c, p, b, r);
  const std::string repro = "repro: preset " + preset + " policy " + std::string(to_string(pol)) + " seed 11 B 2 S 13";
  EXPECT_GT(norm2(x.g), 0.0) << repro;
  EXPECT_EQ(std::memcmp(&x.fr.loss, &y.fr.loss, sizeof(T)), 0) << repro;
  EXPECT_EQ(first_diff(x.g, y.g), "") << "recompute changes bits; " << repro;
}

// Streaming accumulators (one block open at a time, rounded at close) give the bits of full accumulators rounded
// at the end, for the stored and the recomputed backward; the same GradAcc is reused over two batches.
template <class T>
void streaming_case(const std::string& preset, Policy pol) {
  Config c = Config::preset(preset);
  c.policy = pol;
  const auto p = ParamSet<T>::init(c, 5);
  GradAcc<T> st = GradAcc<T>::streaming(p.info);
  for (int rec = 0; rec < 2; ++rec)
    for (uint64_t seed : {21, 22}) {
      const Batch b = random_batch(c, 2, 13, seed);
      StepOptions opt;
      opt.token_chunk = 16;
      opt.recompute = rec != 0;
      const FB<T> full = fwd_bwd<T>(c, p, b, opt);
      ParamSet<T> g = ParamSet<T>::init(c, 99);  // garbage: every entry must be overwritten
      st.clear();
      st.sink = &g;
      const ForwardResult<T> fr = model_forward_backward<T>(c, p, b, opt, st);
      st.finalize(g);
      const std::string repro = "repro: preset " + preset + " policy " + std::string(to_string(pol)) + " seed " +
                                std::to_string(seed) + (rec ? " recompute" : "") + " B 2 S 13";
      EXPECT_EQ(std::memcmp(&full.fr.loss, &fr.loss, sizeof(T)), 0) << repro;
      EXPECT_EQ(first_diff(full.g, g), "") << "streaming accumulators change bits; " << repro;
    }
}

}  // namespace

TEST(ModelGradAcc, StreamingEqualsFullBitwise) {
  streaming_case<double>("tiny", Policy::fp64);
  streaming_case<float>("tiny", Policy::fp32);
  streaming_case<float>("tiny", Policy::bf16);
  streaming_case<float>("tiny-gqa", Policy::fp32);
  streaming_case<float>("tiny-e64", Policy::fp32);
  streaming_case<float>("tiny-dsa", Policy::fp32);
}

TEST(ModelGradAcc, StreamingMisuseIsAnError) {
  const Config c = Config::preset("tiny");
  const auto p = ParamSet<float>::init(c, 5);
  GradAcc<float> st = GradAcc<float>::streaming(p.info);
  auto g = ParamSet<float>::zeros(c);
  const size_t embed = p.find("embed"), head = p.find("lm_head"), wg = p.find("layers.1.moe.experts.wg");
  const int64_t n_wg = p.t[wg].size();
  EXPECT_THROW(st.ptr(embed), trident::Error);  // not open
  EXPECT_THROW(st.finalize(g), trident::Error);  // nothing closed
  EXPECT_THROW(st.close(), trident::Error);      // nothing open
  st.open({embed});
  EXPECT_THROW(st.open({embed}), trident::Error);  // already open
  EXPECT_NO_THROW(st.open({head}));                // blocks nest
  EXPECT_THROW(st.close(), trident::Error);        // no sink
  st.sink = &g;
  st.close();  // lm_head
  st.close();  // embed
  EXPECT_THROW(st.open({embed}), trident::Error);  // closed twice in one step
  EXPECT_THROW(st.open_slices({{wg, n_wg - 1, 2}}), trident::Error);  // past the end
  st.open_slices({{wg, 0, n_wg / 2}});
  st.close();
  try {  // incomplete: finalize names the first parameter with elements not closed, and the count
    st.finalize(g);
    ADD_FAILURE() << "finalize accepted a step with parameters not closed";
  } catch (const trident::Error& e) {
    EXPECT_NE(std::string(e.what()).find("0 of the 64 elements of layers.0.attn_norm were closed"), std::string::npos)
        << e.what();
  }
  st.clear();
  EXPECT_NO_THROW(st.open({embed}));
}

TEST(ModelRecompute, BitwiseAllPolicies) {
  recompute_case<double>("tiny", Policy::fp64);
  recompute_case<float>("tiny", Policy::fp32);
  recompute_case<float>("tiny", Policy::bf16);
  recompute_case<double>("tiny-gqa", Policy::fp64);
  recompute_case<float>("tiny-gqa", Policy::fp32);
  recompute_case<float>("tiny-gqa", Policy::bf16);
  recompute_case<double>("tiny-dsa", Policy::fp64);
  recompute_case<float>("tiny-dsa", Policy::fp32);
  recompute_case<float>("tiny-dsa", Policy::bf16);
}

TEST(ModelDeterminism, RunsAndThreads) {
  for (const char* preset : {"tiny", "tiny-gqa"}) {
    Config c = Config::preset(preset);
    c.policy = Policy::bf16;
    RunConfig rc;
    rc.sequences = 4;  // large enough that the gemm, attention and tile-reduction parallel regions engage
    rc.seq_len = 64;
    auto train = [&](int threads) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Trainer<float> tr(c, rc);
      std::vector<double> losses;
      for (int s = 0; s < 2; ++s) losses.push_back(tr.step(synthetic_batch(c, rc, s)).loss);
      omp_set_num_threads(saved);
      return std::make_pair(losses, tr);
    };
    const auto [l1, t1] = train(1);
    const auto [l2, t2] = train(2);
    const auto [l3, t3] = train(2);
    const std::string repro = std::string("repro: preset ") + preset + " bf16 seqs 4 seq_len 64, 2 steps";
    EXPECT_GT(norm2(t1.grads), 0.0);
    EXPECT_TRUE(same_bits(l1, l2)) << "1 vs 2 threads: loss; " << repro;
    EXPECT_EQ(first_diff(t1.grads, t2.grads), "") << "1 vs 2 threads: grads; " << repro;
    EXPECT_EQ(first_diff(t1.params, t2.params), "") << "1 vs 2 threads: weights; " << repro;
    EXPECT_EQ(first_diff(t1.m, t2.m), "") << repro;
    EXPECT_TRUE(same_bits(l2, l3)) << "run 1 vs run 2: loss; " << repro;
    EXPECT_EQ(first_diff(t2.params, t3.params), "") << "run 1 vs run 2: weights; " << repro;
    EXPECT_EQ(first_diff(t2.grads, t3.grads), "") << "run 1 vs run 2: grads; " << repro;
  }
}

TEST(ModelBatchInvariance, SequenceAloneOrWithOthers) {
  for (Policy pol : {Policy::fp32, Policy::bf16}) {
    for (const char* preset : {"tiny", "tiny-gqa"}) {
      Config c = Config::preset(preset);
      c.policy = pol;
      const auto p = ParamSet<float>::init(c, 3);
      const Batch all = random_batch(c, 3, 16, 99);
      Batch one;
      one.B = 1;
      one.S = 16;
      one.tokens.assign(all.tokens.begin() + 16, all.tokens.begin() + 32);
      one.targets.assign(all.targets.begin() + 16, all.targets.begin() + 32);
      StepOptions opt;
      opt.keep_hidden = true;
      const auto fa = model_forward<float>(c, p, all, opt);
      const auto fo = model_forward<float>(c, p, one, opt);
      const std::vector<float> la(fa.token_loss.begin() + 16, fa.token_loss.begin() + 32);
      const std::vector<float> ha(fa.hidden.begin() + 16 * c.d_model, fa.hidden.begin() + 32 * c.d_model);
      EXPECT_TRUE(same_bits(la, fo.token_loss)) << preset << " " << to_string(pol) << ": per-token loss differs";
      EXPECT_TRUE(same_bits(ha, fo.hidden)) << preset << " " << to_string(pol) << ": final hidden differs";
      double s = 0;
      for (float x : fo.token_loss) s += x;
      EXPECT_GT(s, 0.0);
    }
  }
}

TEST(ModelChunks, TokenChunkDoesNotChangeBits) {
  Config c = Config::preset("tiny");
  c.policy = Policy::fp32;
  const auto p = ParamSet<float>::init(c, 4);
  const Batch b = random_batch(c, 2, 24, 5);
  StepOptions a, z;
  a.token_chunk = 8;
  z.token_chunk = 48;
  const auto x = fwd_bwd<float>(c, p, b, a), y = fwd_bwd<float>(c, p, b, z);
  EXPECT_EQ(x.fr.loss, y.fr.loss);
  EXPECT_EQ(first_diff(x.g, y.g), "");
}

TEST(ModelLoss, AllIgnoredBatchIsDefined) {
  Config c = Config::preset("tiny-gqa");
  const auto p = ParamSet<float>::init(c, 4);
  Batch b = random_batch(c, 2, 9, 5);
  std::fill(b.targets.begin(), b.targets.end(), -100);
  const auto x = fwd_bwd<float>(c, p, b, {});
  EXPECT_EQ(x.fr.n_valid, 0);
  EXPECT_EQ(x.fr.loss, 0.0f);  // defined: loss 0 and zero gradients, never NaN
  EXPECT_EQ(norm2(x.g), 0.0);
  // loss = round(exact sum of token losses) / n_valid
  const Batch v = random_batch(c, 2, 9, 5);
  const auto y = fwd_bwd<float>(c, p, v, {});
  EXPECT_GT(y.fr.n_valid, 0);
  EXPECT_EQ(y.fr.loss, y.fr.loss_sum.round() / static_cast<float>(y.fr.n_valid));
}

// MLA absorbed form (what the reference computes) vs the direct form (k_nope = c_kv W_uk, v = c_kv W_uv per
// head, standard causal attention), both fp64; the direct one uses libm as an independent oracle.
TEST(ModelMla, AbsorbedMatchesDirect) {
  Config c = Config::preset("tiny");
  c.policy = Policy::fp64;
  const auto p = ParamSet<double>::init(c, 8);
  const int64_t S = 12, d = c.d_model, H = c.heads, Dn = c.nope_dim, Dr = c.rope_dim, Dv = c.v_dim,
                r = c.kv_lora_rank, Qw = H * (Dn + Dr);
  const LayerW<double> W = layer_weights<double>(c, p, 1);
  std::vector<double> a(static_cast<size_t>(S * d));
  for (int64_t i = 0; i < S * d; ++i) a[i] = uniform_pm1(8, 55, static_cast<uint64_t>(i));
  const TokenRows rows = TokenRows::contiguous(1, S, c.tile);
  const auto rope = rope_table<double>(S, Dr, c.rope_theta);
  AttnActs<double> A;
  std::vector<double> y(static_cast<size_t>(S * d));
  attention_forward<double>(Policy::fp64, c, W.attn, a.data(), rows, rope, A, y.data());

  auto mat = [](const double* x, const double* w, int64_t n, int64_t k, int64_t m, int64_t ldw, int64_t off) {
    std::vector<double> o(static_cast<size_t>(n * m), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t t = 0; t < k; ++t) o[i * m + j] += x[i * k + t] * w[t * ldw + off + j];
    return o;
  };
  auto rot = [&](double* u, int64_t pos) {
    for (int64_t i = 0; i < Dr / 2; ++i) {
      const double ang = static_cast<double>(pos) * std::pow(c.rope_theta, -2.0 * i / static_cast<double>(Dr));
      const double x0 = u[i], x1 = u[i + Dr / 2];
      u[i] = x0 * std::cos(ang) - x1 * std::sin(ang);
      u[i + Dr / 2] = x1 * std::cos(ang) + x0 * std::sin(ang);
    }
  };
  auto q = mat(a.data(), W.attn.wq, S, d, Qw, Qw, 0);
  auto cc = mat(a.data(), W.attn.wdkv, S, d, r + Dr, r + Dr, 0);
  std::vector<double> ckv(static_cast<size_t>(S * r)), kr(static_cast<size_t>(S * Dr));
  for (int64_t t = 0; t < S; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < r; ++i) ss += cc[t * (r + Dr) + i] * cc[t * (r + Dr) + i];
    const double ri = 1.0 / std::sqrt(ss / r + c.norm_eps);
    for (int64_t i = 0; i < r; ++i) ckv[t * r + i] = cc[t * (r + Dr) + i] * ri * W.attn.kv_norm[i];
    for (int64_t i = 0; i < Dr; ++i) kr[t * Dr + i] = cc[t * (r + Dr) + r + i];
    rot(&kr[t * Dr], t);
    for (int64_t h = 0; h < H; ++h) rot(&q[t * Qw + h * (Dn + Dr) + Dn], t);
  }
  std::vector<double> ocat(static_cast<size_t>(S * H * Dv), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const auto kn = mat(ckv.data(), W.attn.wuk, S, r, Dn, H * Dn, h * Dn);
    const auto vv = mat(ckv.data(), W.attn.wuv, S, r, Dv, H * Dv, h * Dv);
    for (int64_t t = 0; t < S; ++t) {
      std::vector<double> sc(static_cast<size_t>(t + 1));
      double mx = -1e300, l = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (int64_t i = 0; i < Dn; ++i) s += q[t * Qw + h * (Dn + Dr) + i] * kn[j * Dn + i];
        for (int64_t i = 0; i < Dr; ++i) s += q[t * Qw + h * (Dn + Dr) + Dn + i] * kr[j * Dr + i];
        sc[j] = s / std::sqrt(static_cast<double>(Dn + Dr));
        mx = std::max(mx, sc[j]);
      }
      for (int64_t j = 0; j <= t; ++j) l += std::exp(sc[j] - mx);
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t i = 0; i < Dv; ++i) ocat[t * H * Dv + h * Dv + i] += std::exp(sc[j] - mx) / l * vv[j * Dv + i];
    }
  }
  int64_t bad = 0;
  for (int64_t t = 0; t < S; ++t)
    for (int64_t j = 0; j < d; ++j) {
      double ref = 0, sum_abs = 0;
      for (int64_t k = 0; k < H * Dv; ++k) {
        ref += ocat[t * H * Dv + k] * W.attn.wo[k * d + j];
        sum_abs += std::abs(ocat[t * H * Dv + k] * W.attn.wo[k * d + j]);
      }
      const double bound = tolerance_bound("mla_absorbed", "fp64", "vs_direct", H * Dv + S + r, sum_abs);
      if (std::abs(y[t * d + j] - ref) > bound && bad++ < 5)
        ADD_FAILURE() << "token " << t << " col " << j << ": absorbed " << y[t * d + j] << " direct " << ref;
      EXPECT_GT(sum_abs, 0.0);
    }
  EXPECT_EQ(bad, 0);
}

TEST(ModelTraining, Bf16LossFallsOver200Steps) {
  Config c = Config::preset("tiny");
  c.policy = Policy::bf16;
  RunConfig rc;
  rc.sequences = 4;
  rc.seq_len = 16;
  rc.lr = 3e-3;
  Trainer<float> tr(c, rc);
  std::vector<double> L;
  for (int64_t s = 0; s < 200; ++s) {
    L.push_back(tr.step(synthetic_batch(c, rc, s)).loss);
    ASSERT_TRUE(std::isfinite(L.back())) << "step " << s;
  }
  auto mean = [&](int a, int b) {
    double m = 0;
    for (int i = a; i < b; ++i) m += L[i];
    return m / (b - a);
  };
  std::printf("[train bf16] loss step 1 %.4f, mean 1-50 %.4f, 51-100 %.4f, 101-150 %.4f, 151-200 %.4f, last 20 %.4f\n",
              L[0], mean(0, 50), mean(50, 100), mean(100, 150), mean(150, 200), mean(180, 200));
  EXPECT_LT(mean(180, 200), 0.7 * L[0]) << "repro: trident train --preset tiny --policy bf16 --steps 200 --seqs 4 --seq-len 16";
  EXPECT_GT(mean(0, 50), mean(50, 100));
  EXPECT_GT(mean(50, 100), mean(100, 150));
  EXPECT_GT(mean(100, 150), mean(150, 200));
}

TEST(ModelTraining, RouterBiasMovesByGammaAgainstTheLoad) {
  Config c = Config::preset("tiny");
  c.bias_rate = 1e-3;
  RunConfig rc;
  rc.sequences = 2;
  rc.seq_len = 16;
  Trainer<float> tr(c, rc);
  const Batch b = synthetic_batch(c, rc, 0);
  // loads of the step, from a forward with the same weights
  const auto fr = model_forward<float>(c, tr.params, b, {});
  tr.step(b);
  int moved = 0;
  for (int64_t i = c.dense_layers; i < c.layers; ++i) {
    const auto& load = fr.load[static_cast<size_t>(i)];
    int64_t total = 0;
    for (int64_t x : load) total += x;
    EXPECT_EQ(total, b.B * b.S * c.top_k);
    const auto& bias = tr.params[fmt::format("layers.{}.moe.router_bias", i)].data;
    for (int64_t e = 0; e < c.experts; ++e) {
      const float want = load[e] * c.experts < total ? 1e-3f : load[e] * c.experts > total ? -1e-3f : 0.0f;
      EXPECT_EQ(bias[e], want) << "layer " << i << " expert " << e << " load " << load[e];
      moved += bias[e] != 0.0f;
    }
  }
  EXPECT_GT(moved, 0);
}

// Per-token results never depend on the reduction tile: token losses and the final hidden are bitwise
// independent of T. (The loss and the gradients do depend on T by contract: in-tile sums are fp sums.)
TEST(ModelTiles, ForwardIndependentOfTile) {
  for (Policy pol : {Policy::fp32, Policy::bf16}) {
    Config c = Config::preset("tiny");
    c.policy = pol;
    const auto p = ParamSet<float>::init(c, 21);
    const Batch b = random_batch(c, 2, 24, 22);
    StepOptions opt;
    opt.keep_hidden = true;
    c.tile = 8;
    const auto x = model_forward<float>(c, p, b, opt);
    c.tile = 5;
    const auto y = model_forward<float>(c, p, b, opt);
    EXPECT_TRUE(same_bits(x.token_loss, y.token_loss)) << to_string(pol);
    EXPECT_TRUE(same_bits(x.hidden, y.hidden)) << to_string(pol);
    EXPECT_GT(x.loss, 0.0f);
  }
}

// Recompute vs stored after a few optimizer steps (router biases no longer zero, routing uneven).
TEST(ModelRecompute, BitwiseAfterTraining) {
  for (const char* preset : {"tiny", "tiny-gqa"}) {
    Config c = Config::preset(preset);
    c.policy = Policy::bf16;
    c.bias_rate = 0.05;  // large enough to move the routing within 3 steps
    RunConfig rc;
    rc.sequences = 2;
    rc.seq_len = 24;
    Trainer<float> tr(c, rc);
    for (int s = 0; s < 3; ++s) tr.step(synthetic_batch(c, rc, s));
    const auto& bias = tr.params["layers.1.moe.router_bias"].data;
    EXPECT_NE(*std::max_element(bias.begin(), bias.end()), 0.0f);
    const Batch b = random_batch(c, 2, 24, 31);
    StepOptions a, r;
    r.recompute = true;
    const auto x = fwd_bwd<float>(c, tr.params, b, a), y = fwd_bwd<float>(c, tr.params, b, r);
    EXPECT_EQ(x.fr.loss, y.fr.loss) << preset;
    EXPECT_EQ(first_diff(x.g, y.g), "") << preset;
    EXPECT_GT(norm2(x.g), 0.0);
  }
}

// The bf16 policy stays close to fp32: per tensor, ||g_bf16 - g_fp32|| <= bound(||g_fp32||) (norm-wise; catches a
// misplaced rounding or a wrong operand stride in the bf16 path, which the fp64 FD test cannot see).
// top_k = experts: every expert is selected, so no routing decision can flip between the policies (a flip
// is a discontinuity, not an error).
TEST(ModelPolicies, Bf16GradsCloseToFp32) {
  for (const char* preset : {"tiny", "tiny-gqa"}) {
    Config c = Config::preset(preset);
    c.top_k = c.experts;
    const auto p = ParamSet<float>::init(c, 41);
    const Batch b = random_batch(c, 2, 24, 42);
    c.policy = Policy::fp32;
    const auto x = fwd_bwd<float>(c, p, b, {});
    c.policy = Policy::bf16;
    const auto y = fwd_bwd<float>(c, p, b, {});
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p.info[i].trainable) continue;
      double dn = 0, n = 0;
      for (int64_t k = 0; k < x.g.t[i].size(); ++k) {
        const double a = x.g.t[i][k], e = y.g.t[i][k];
        dn += (a - e) * (a - e);
        n += a * a;
      }
      if (n == 0) continue;
      const double rel = std::sqrt(dn / n);
      if (rel > worst) worst = rel, worst_name = p.info[i].name;
      EXPECT_LE(std::sqrt(dn), tolerance_bound("model_grad", "bf16", "vs_fp32", 0, std::sqrt(n)))
          << preset << " " << p.info[i].name << ": relative norm difference " << rel;
    }
    std::printf("[bf16 vs fp32 %s] worst relative gradient difference %.3g (%s); loss %.6f vs %.6f\n", preset, worst,
                worst_name.c_str(), x.fr.loss, y.fr.loss);
    EXPECT_GT(worst, 0.0);  // the policies really differ
  }
}

// embedding_backward_round (the streaming reference's embedding gradient): the bits of zeroed accumulators +
// embedding_backward + exact_round for every row, with ids repeated inside and across tiles, rows outside the slice
// (-1), empty tiles, ids no row has (+0 rows), Inf / NaN and cancelling rows; an id >= V is one error.
TEST(EmbeddingBackward, RoundedEqualsAccumulateThenRound) {
  const uint64_t seed = 41;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  const int64_t V = 37, d = 300;  // d past tile_sum_round's 256-column blocks
  for (int variant = 0; variant < 3; ++variant) {
    const int64_t N = variant == 2 ? 0 : 90;
    std::vector<int32_t> tok(static_cast<size_t>(N));
    for (auto& t : tok) t = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % (V / 2));  // ids >= V/2: no row
    std::vector<float> dout(static_cast<size_t>(N * d));
    for (auto& x : dout) x = static_cast<float>(std::ldexp(nd(rng), static_cast<int>(rng() % 40) - 20));
    if (variant == 1) {
      dout[5] = std::numeric_limits<float>::infinity();
      dout[7 * d + 9] = std::numeric_limits<float>::quiet_NaN();
      tok[3] = tok[4];  // rows 3 and 4: the same id, cancelling
      for (int64_t c = 0; c < d; ++c) dout[static_cast<size_t>(4 * d + c)] = -dout[static_cast<size_t>(3 * d + c)];
    }
    std::vector<int64_t> segs = {0};
    while (segs.back() < N) segs.push_back(std::min<int64_t>(N, segs.back() + static_cast<int64_t>(rng() % 12)));
    if (N == 0) segs.push_back(0);
    std::vector<ExactAcc<float>> acc(static_cast<size_t>(V * d));
    embedding_backward<float>(acc.data(), tok.data(), dout.data(), N, d, segs);
    std::vector<float> want(static_cast<size_t>(V * d)), got(static_cast<size_t>(V * d), -7.0f);
    exact_round<float>(acc.data(), want.data(), V * d);
    embedding_backward_round<float>(got.data(), tok.data(), dout.data(), N, d, V, segs);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "repro: seed=" << seed << " variant=" << variant;
  }
  std::vector<int32_t> bad = {1, 40};
  std::vector<float> dout(2 * d), out(static_cast<size_t>(V * d));
  const std::vector<int64_t> segs = {0, 2};
  EXPECT_THROW(embedding_backward_round<float>(out.data(), bad.data(), dout.data(), 2, d, V, segs), Error);
}

// The distributed step's embedding slices as tile partials (docs/parallel.md section 4): every (row, tile) place of
// the send layout written (+0 without a term, padding rows included), and each row's partials, summed exactly and
// rounded, equal the accumulated and rounded rows.
TEST(EmbeddingBackward, PartialsSumToTheAccumulatedRows) {
  const uint64_t seed = 43;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  const int64_t V = 37, d = 20, br = 5, nb = (V + br - 1) / br;  // 3 padding rows in the last block
  const int64_t N = 90;
  std::vector<int32_t> tok(static_cast<size_t>(N));
  for (auto& t : tok) t = rng() % 9 == 0 ? -1 : static_cast<int32_t>(rng() % V);
  std::vector<float> dout(static_cast<size_t>(N * d));
  for (auto& x : dout) x = static_cast<float>(std::ldexp(nd(rng), static_cast<int>(rng() % 40) - 20));
  std::vector<int64_t> segs = {0};
  while (segs.back() < N) segs.push_back(std::min<int64_t>(N, segs.back() + static_cast<int64_t>(rng() % 12)));
  const int64_t nt = static_cast<int64_t>(segs.size()) - 1;
  std::vector<ExactAcc<float>> acc(static_cast<size_t>(V * d));
  embedding_backward<float>(acc.data(), tok.data(), dout.data(), N, d, segs);
  std::vector<float> want(static_cast<size_t>(V * d));
  exact_round<float>(acc.data(), want.data(), V * d);
  std::vector<float> buf(static_cast<size_t>(nb * nt * br * d), -7.0f);
  const TilePartials<float> tp{buf.data(), d, br, nb, nt, 0};
  embedding_backward_partials<float>(tp, tok.data(), dout.data(), N, d, segs);
  for (float x : buf) ASSERT_NE(x, -7.0f) << "repro: seed=" << seed << ": a place left unwritten";
  for (int64_t e = 0; e < V * d; ++e) {
    ExactAcc<float> a;
    for (int64_t t = 0; t < nt; ++t) a.add(*tp.at(t, e));
    const float got = a.round();
    ASSERT_EQ(std::memcmp(&got, &want[static_cast<size_t>(e)], sizeof(float)), 0) << "repro: seed=" << seed << " element " << e;
  }
  for (int64_t t = 0; t < nt; ++t)  // padding rows: +0
    for (int64_t e = V * d; e < nb * br * d; ++e) ASSERT_EQ(std::bit_cast<uint32_t>(*tp.at(t, e)), 0u);
  std::vector<int32_t> bad = {1, 40};  // an id past the buffer's rows
  std::vector<float> d2(2 * d);
  const std::vector<int64_t> s2 = {0, 2};
  EXPECT_THROW(embedding_backward_partials<float>(TilePartials<float>{buf.data(), d, br, nb, 1, 0}, bad.data(),
                                                  d2.data(), 2, d, s2),
               Error);
}
