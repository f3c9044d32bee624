"""The kernel set written in ordinary PyTorch: the worked example of docs/torch.md.

Every op of the step's kernel set (the Kernels<T> interface, parallel/step_kernels.h) as a PyTorch user writes it:
torch.matmul, torch.rsqrt, F.silu, torch.softmax / logsumexp, F.cross_entropy, an attention core in the
(B, H, S, D) layout of F.scaled_dot_product_attention (used where the installed torch has it), a stable sort for
top-k, index_add_, and autograd for every backward op. Nothing here follows the reference's summation orders, so
floating outputs differ from the goldens by rounding (measured by torch_report.py); integer and selection outputs
(router `sel`, DSA `sel`) are exact.

    from trident_golden.torch_ops import kernels
    out = kernels("rmsnorm_forward", case.inputs, case.shapes)     # dict of numpy arrays, or None

`kernels(op, inputs, shapes)` has the signature of an implementation for trident_golden.check: `inputs` are the
golden's numpy arrays (float32 for the f32 goldens), `shapes` its scalars; it returns the outputs as numpy arrays
of the golden's dtype and shape. Accumulator outputs (wgrad_acc, sum_acc, embedding_backward, the weight-gradient
outputs G.*, dg, dkv, dW, ...) are the rounded value of the call's contribution: the float32 sum torch computes.

Each op is a method of TorchKernels whose docstring states the adapter between the golden's layout and the layout
a kernel author uses (docs/torch.md lists them all). The arithmetic goes through a few overridable hooks (matmul,
activation, RMSNorm, RoPE, attention mask, softmax, top-k, ...) so that torch_bugs.py can plant one realistic bug at
a time by overriding one hook.

Policy: TorchKernels(policy="bf16") rounds every GEMM and attention operand to bfloat16 and accumulates in float32,
as the bf16 policy states (docs/numerics.md). The checker passes a case's policy as shapes["policy"] (ops that take
one), and `kernels` picks the matching instance (`kernels_for(policy)`)."""

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:   # the package itself needs only h5py and numpy
    raise ImportError(f"trident_golden.torch_ops needs PyTorch ({e}): apt-get install python3-torch") from e

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")   # torch >= 2.0 (scale= from 2.1)


def _t(a):
    """numpy -> torch (a copy: the caller's arrays are never written)."""
    return torch.from_numpy(np.array(a, copy=True))


def _np(x, dtype=np.float32, shape=None):
    a = x.detach().cpu().numpy().astype(dtype, copy=False)
    return a.reshape(shape) if shape is not None else a


# The bf16 policy under autograd. The policy rounds a tensor to bf16 where it enters a GEMM, nowhere else, and the
# backward GEMMs are GEMMs too: dA = dC B^T and dB = A^T dC round dC (the incoming gradient) as their operand and
# return float32 results. A plain cast x.to(bfloat16).to(float32) gets both wrong under autograd: its backward rounds
# the gradient of x to bf16 on its way out (a gradient that is no GEMM operand) and dC enters the backward GEMMs
# unrounded. _RoundOperand rounds forward and passes the gradient through; _RoundGrad, on a GEMM's result, rounds
# the incoming gradient for the backward GEMMs.
class _RoundOperand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


class _RoundGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


class TorchKernels:
    """The kernel set in PyTorch. Call it as kernels(op, inputs, shapes)."""

    OPS = ("mm", "wgrad_acc", "sum_acc", "exact_round", "embedding_forward", "embedding_backward",
           "rmsnorm_forward", "rmsnorm_backward", "residual_forward", "swiglu_forward", "swiglu_backward_dgrad",
           "expert_forward", "expert_backward_dgrad", "router_forward", "router_backward", "moe_combine_forward",
           "moe_combine_backward", "moe_dx_sum", "gather_rows", "scatter_rows", "attn_qkv_forward",
           "kv_zigzag_reorder", "kv_zigzag_to_gather_acc", "attn_core_forward", "attn_core_backward",
           "attn_doc_core_forward", "attn_doc_core_backward", "dsa_select", "dsa_core_forward", "dsa_core_backward",
           "attn_out_forward", "attn_out_backward", "attn_qkv_backward", "linear_ce_forward", "linear_ce_backward",
           "grad_sq_acc", "adamw_step", "router_bias_update")

    def __init__(self, policy="fp32", dtype=torch.float32):
        if policy not in ("fp32", "bf16", "fp64"):
            raise ValueError(f"policy '{policy}': expected fp32, bf16 or fp64")
        self.policy = policy
        self.dtype = torch.float64 if policy == "fp64" else dtype

    def __call__(self, op, inputs, shapes):
        fn = getattr(self, "op_" + op, None) if op in self.OPS else None
        if fn is None:
            return None
        x = {k: _t(v) for k, v in inputs.items()}
        return fn(x, dict(shapes))

    # ---- hooks (torch_bugs.py overrides these) ----------------------------------------------------------------
    def operand(self, x):
        """A GEMM / attention operand under the policy: bf16 rounds it (fp32 accumulation follows); its gradient
        passes unrounded (_RoundOperand)."""
        return _RoundOperand.apply(x) if self.policy == "bf16" else x

    def gemm_out(self, y):
        """A GEMM's result under the policy: bf16 rounds the gradient arriving at it, the backward GEMMs' operand
        (_RoundGrad)."""
        return _RoundGrad.apply(y) if self.policy == "bf16" else y

    def matmul(self, a, b):
        return self.gemm_out(torch.matmul(self.operand(a), self.operand(b)))

    def act(self, x):
        """The SwiGLU gate activation."""
        return F.silu(x)

    def rms_eps(self, eps):
        return eps

    def rmsnorm(self, x, g, eps):
        """y = x * rsqrt(mean(x^2) + eps) * g, rinv; the usual RMSNorm module body."""
        rinv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.rms_eps(eps))
        return x * rinv * g, rinv.squeeze(-1)

    def rope_pos(self, pos):
        return pos

    def rope(self, x, cos, sin, pos):
        """Half-split (GPT-NeoX) rotary embedding of x (N, heads, D) at positions pos (N): cos/sin tables
        (max_pos, D/2)."""
        c = cos[self.rope_pos(pos)].unsqueeze(1)
        s = sin[self.rope_pos(pos)].unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def attn_allowed(self, qpos, qdoc, S):
        """(Nq, S) boolean: key j visible to query r (causal by global position; packed: inside its document)."""
        j = torch.arange(S)
        ok = j[None, :] <= qpos[:, None]
        if qdoc is not None:
            ok = ok & (j[None, :] >= qdoc[:, None])
        return ok

    def attn_scale(self, cd):
        return cd["scale"]

    def expand_kv(self, k, rep):
        """(B, G, S, D) -> (B, H, S, D): head h reads KV group h // rep (torch's repeat_interleave, as GQA does)."""
        return k.repeat_interleave(rep, dim=1)

    def softmax(self, s):
        return torch.softmax(s, dim=-1)

    def topk_desc(self, scores, k):
        """Indices of the k largest of each row, ties to the lower index (a stable descending sort: torch.topk
        does not specify its tie order, and router / DSA selections must be exact)."""
        return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]

    def router_gates(self, s_sel, alpha):
        return alpha * s_sel / s_sel.sum(-1, keepdim=True)

    def ce_logits(self, logits):
        return logits

    def ce_ignore_index(self):
        return -100

    # ---- GEMM-like ---------------------------------------------------------------------------------------------
    def op_mm(self, x, s):
        """C (M, ldc) = A (M, lda)[:, :K] @ op(B); op(B) = B (K, ldb)[:, :N] or B (N, ldb)[:, :K]^T (trans_b).
        Columns N..ldc-1 of C are +0. Adapter: the leading dimensions are column slices of row-major arrays."""
        M, N, K = s["M"], s["N"], s["K"]
        A = x["A"].reshape(M, s["lda"])[:, :K]
        B = x["B"]
        B = B.reshape(N, s["ldb"])[:, :K].t() if s["trans_b"] else B.reshape(K, s["ldb"])[:, :N]
        C = torch.zeros(M, s["ldc"], dtype=self.dtype)
        C[:, :N] = self.matmul(A, B)
        return {"C": _np(C)}

    def op_wgrad_acc(self, x, s):
        """acc (K, M) = X[rows, :K]^T @ dY[rows, :M], rows = segs[0]..segs[-1] (X (rows, ldx), dY (rows, ldy)).
        The golden's accumulator is returned as the rounded contribution of the call (a zeroed accumulator)."""
        K, M = s["K"], s["M"]
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        X = x["X"].reshape(-1, s["ldx"])[r0:r1, :K]
        dY = x["dY"].reshape(-1, s["ldy"])[r0:r1, :M]
        return {"acc": _np(self.matmul(X.t(), dY).reshape(K, M))}

    def op_sum_acc(self, x, s):
        """acc (J) = sum over rows segs[0]..segs[-1] of x (rows, J)."""
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        return {"acc": _np(x["x"].reshape(-1, s["J"])[r0:r1].sum(0))}

    def op_exact_round(self, x, s):
        """out (n) = round(acc): the golden stores the accumulator by its rounded values, so this is a copy."""
        return {"out": _np(x["acc"].clone())}

    # ---- per-token ops -----------------------------------------------------------------------------------------
    def op_embedding_forward(self, x, s):
        """out (N, d) = F.embedding(tokens (N), embed (V, d))."""
        return {"out": _np(F.embedding(x["tokens"].long(), x["embed"]))}

    def op_embedding_backward(self, x, s):
        """dembed (rows, d) = index_add_ of dout (N, d) rows by tokens (N); token -1 skipped (rows of another
        slice); only rows segs[0]..segs[-1]."""
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        tok = x["tokens"].long()[r0:r1]
        dout = x["dout"].reshape(-1, s["d"])[r0:r1]
        keep = tok >= 0
        out = torch.zeros(s["rows"], s["d"], dtype=self.dtype)
        out.index_add_(0, tok[keep], dout[keep])
        return {"dembed": _np(out)}

    def op_rmsnorm_forward(self, x, s):
        """y (N, ldy) = RMSNorm(x (N, ldx)[:, :d]) * g (d), rinv (N); columns d.. of y are +0."""
        N, d = s["N"], s["d"]
        X = x["x"].reshape(N, s["ldx"])[:, :d]
        y, rinv = self.rmsnorm(X, x["g"], s["eps"])
        Y = torch.zeros(N, s["ldy"], dtype=self.dtype)
        Y[:, :d] = y
        return {"y": _np(Y), "rinv": _np(rinv)}

    def rmsnorm_grad(self, X, rinv, g, dy):
        """RMSNorm's backward from the saved rinv (the op is not given eps), as fused RMSNorm kernels write it:
        xhat = x * rinv; dx = rinv * (dy*g - xhat * mean(dy*g*xhat)); dg = sum over rows of dy * xhat."""
        r = rinv.unsqueeze(-1)
        xhat = X * r
        dxh = dy * g
        dx = r * (dxh - xhat * (dxh * xhat).mean(-1, keepdim=True))
        return dx, (dy * xhat).sum(0)

    def op_rmsnorm_backward(self, x, s):
        """dx (N, lddx) and dg (d) of RMSNorm from dy (N, lddy), x (N, ldx), rinv (N), g (d); dg sums the
        rows segs[0]..segs[-1]; columns d.. of dx are +0."""
        N, d = s["N"], s["d"]
        X = x["x"].reshape(N, s["ldx"])[:, :d]
        dy = x["dy"].reshape(N, s["lddy"])[:, :d]
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        dx, _ = self.rmsnorm_grad(X, x["rinv"], x["g"], dy)
        _, dg = self.rmsnorm_grad(X[r0:r1], x["rinv"][r0:r1], x["g"], dy[r0:r1])
        DX = torch.zeros(N, s["lddx"], dtype=self.dtype)
        DX[:, :d] = dx
        return {"dx": _np(DX), "dg": _np(dg)}

    def residual(self, a, b):
        return a + b

    def op_residual_forward(self, x, s):
        """out (n) = a + b."""
        return {"out": _np(self.residual(x["a"], x["b"]))}

    def swiglu(self, X, wg, wu, wd):
        ug = self.matmul(X, wg)
        uu = self.matmul(X, wu)
        h = self.act(ug) * uu
        return ug, uu, h, self.matmul(h, wd)

    def op_swiglu_forward(self, x, s):
        """SwiGLU FFN: x (N, d); wg, wu (d, F) and wd (F, d) as stored (in, out) - an nn.Linear's weight is
        their transpose; ug = x wg, uu = x wu, h = silu(ug) * uu, y = h wd."""
        ug, uu, h, y = self.swiglu(x["x"], x["wg"], x["wu"], x["wd"])
        return {"ug": _np(ug), "uu": _np(uu), "h": _np(h), "y": _np(y)}

    op_expert_forward = op_swiglu_forward

    def op_swiglu_backward_dgrad(self, x, s):
        """dug, duu (N, F) by autograd of h = silu(ug) * uu, y = h wd with ug, uu the saved activations as leaves;
        dx (N, d) = dug wg^T + duu wu^T."""
        ug = x["ug"].clone().requires_grad_(True)
        uu = x["uu"].clone().requires_grad_(True)
        if ug.numel() == 0:
            z = torch.zeros_like
            return {"dug": _np(z(ug)), "duu": _np(z(uu)), "dx": _np(z(x["dy"]))}
        # dh = dy wd^T as its own GEMM (bf16 policy: bf16 operands, an fp32 result): autograd through a bf16-rounded
        # operand would hand back dh rounded to bf16, which the policy does not do
        dh = self.matmul(x["dy"], x["wd"].t())
        dug, duu = torch.autograd.grad(self.act(ug) * uu, (ug, uu), dh)
        dx = self.matmul(dug, x["wg"].t()) + self.matmul(duu, x["wu"].t())
        return {"dug": _np(dug), "duu": _np(duu), "dx": _np(dx)}

    op_expert_backward_dgrad = op_swiglu_backward_dgrad

    # ---- router and MoE ----------------------------------------------------------------------------------------
    def op_router_forward(self, x, s):
        """Sigmoid router with an aux-loss-free bias: logits = a wr (N, E); scores = sigmoid(logits); sel (N, K) =
        the K largest scores + bias (ties to the lower expert), listed ascending; gates = alpha * s_sel / sum s_sel."""
        K = s["K"]
        logits = self.matmul(x["a"], x["wr"])
        scores = torch.sigmoid(logits)
        sel = self.topk_desc(scores + x["bias"], K).sort(dim=-1).values
        gates = self.router_gates(scores.gather(1, sel), s["alpha"])
        return {"logits": _np(logits), "scores": _np(scores), "sel": _np(sel, np.int32), "gates": _np(gates)}

    def op_router_backward(self, x, s):
        """dlogits (N, E) from dgates (N, K): autograd of gates = alpha * s_sel / sum s_sel with the saved scores as
        a leaf, then sigmoid's derivative s (1 - s); zero for unselected experts."""
        sc = x["scores"].clone().requires_grad_(True)
        sel = x["sel"].long()
        gates = self.router_gates(sc.gather(1, sel), s["alpha"])
        (ds,) = torch.autograd.grad(gates, sc, x["dgates"])
        return {"dlogits": _np(ds * sc.detach() * (1 - sc.detach()))}

    def op_moe_combine_forward(self, x, s):
        """out (N, d) = sum_k gates (N, K)[:, k] * yk (N*K, d) viewed (N, K, d): a batched (1, K) @ (K, d)."""
        N, d, K = s["N"], s["d"], s["K"]
        out = torch.bmm(x["gates"].reshape(N, 1, K), x["yk"].reshape(N, K, d)).reshape(N, d)
        return {"out": _np(out)}

    def op_moe_combine_backward(self, x, s):
        """For the (token, slot) pairs tk (n) = t*K + k: dgates (N, K) flat[tk] = dout[t] . yk[tk] (others +0);
        dyk (n, d) row j = gates flat[tk[j]] * dout[t]."""
        K, d = s["K"], s["d"]
        tk = x["tk"].long()
        N = (int(tk.max()) + K) // K if tk.numel() else 0
        t = torch.div(tk, K, rounding_mode="floor")
        dout = x["dout"].reshape(N, d)
        yk = x["yk"].reshape(N * K, d)
        dg = torch.zeros(N * K, dtype=self.dtype)
        dg[tk] = (dout[t] * yk[tk]).sum(-1)
        dyk = x["gates"].reshape(-1)[tk].unsqueeze(1) * dout[t]
        return {"dgates": _np(dg.reshape(N, K)), "dyk": _np(dyk)}

    def op_moe_dx_sum(self, x, s):
        """dx (N, d) = dxk (N*K, d) viewed (N, K, d) summed over K."""
        return {"dx": _np(x["dxk"].reshape(s["N"], s["K"], s["d"]).sum(1))}

    def gather_index(self, idx, rows):
        """The row indices as the kernel uses them (rows: the rows of the indexed array)."""
        return idx

    def op_gather_rows(self, x, s):
        """dst (n, w) = src[idx] (index_select)."""
        src = x["src"].reshape(-1, s["w"])
        idx = self.gather_index(x["idx"].long(), src.shape[0])
        return {"dst": _np(src.index_select(0, idx))}

    def op_scatter_rows(self, x, s):
        """dst (max(idx) + 1, w): row idx[j] = src (n, w) row j (index_copy_; other rows +0)."""
        rows = int(x["idx"].max()) + 1 if x["idx"].numel() else 0
        idx = self.gather_index(x["idx"].long(), rows)
        dst = torch.zeros(rows, s["w"], dtype=self.dtype)
        if idx.numel():
            dst.index_copy_(0, idx, x["src"].reshape(-1, s["w"]))
        return {"dst": _np(dst)}

    # ---- attention projections ---------------------------------------------------------------------------------
    @staticmethod
    def _att(cfg):
        a = cfg["attention"]
        return a, a["kind"] == "mla"

    def qkv_forward(self, cfg, W, a, pos, cos, sin):
        """The projections (a) of attention, differentiable in a and W. Returns a dict of activations:
        MLA: q (N, H*(Dn+Dr)) = a wq; qc (N, H, r+Dr) = [q_nope_h wuk_h^T, rope(q_rope_h)]; c (N, r+Dr) = a wdkv;
        kv_rinv (N); payload (N, P) = [RMSNorm(c[:, :r]) * kv_norm, rope(c[:, r:]), +0 (DSA's indexer key)].
        GQA: qc (N, H, Dh) = rope(a wq); payload (N, P) = [rope(a wk) per KV head, a wv]."""
        att, mla = self._att(cfg)
        N, H = a.shape[0], att["heads"]
        if not mla:
            Dh, Hkv = att["head_dim"], att["kv_heads"]
            qc = self.rope(self.matmul(a, W["wq"]).reshape(N, H, Dh), cos, sin, pos)
            k = self.rope(self.matmul(a, W["wk"]).reshape(N, Hkv, Dh), cos, sin, pos)
            v = self.matmul(a, W["wv"])
            return {"qc": qc, "payload": torch.cat((k.reshape(N, -1), v), 1)}
        Dn, Dr, r = att["nope_dim"], att["rope_dim"], att["kv_lora_rank"]
        q = self.matmul(a, W["wq"])
        qh = q.reshape(N, H, Dn + Dr)
        wuk = W["wuk"].reshape(r, H, Dn)                                # wuk (r, H*Dn): head h = columns h*Dn..
        q_lat = self.gemm_out(torch.einsum("nhd,rhd->nhr", self.operand(qh[..., :Dn]), self.operand(wuk)))
        qc = torch.cat((q_lat, self.rope(qh[..., Dn:], cos, sin, pos)), -1)
        c = self.matmul(a, W["wdkv"])
        kv, rinv = self.rmsnorm(c[:, :r], W["kv_norm"], cfg["norm_eps"])
        kr = self.rope(c[:, None, r:], cos, sin, pos).reshape(N, Dr)
        payload = torch.cat((kv, kr), 1)
        return {"q": q, "qc": qc, "c": c, "kv_rinv": rinv, "payload": payload}

    @staticmethod
    def _weights(x):
        return {k[2:]: v for k, v in x.items() if k.startswith("W.")}

    @staticmethod
    def _rope_tables(x, s):
        h = s["rope.D"] // 2
        return x["rope.cos"].reshape(-1, h), x["rope.sin"].reshape(-1, h)

    def op_attn_qkv_forward(self, x, s):
        """Adapter: acts.* are flat; acts.q (N, H*(Dn+Dr)), acts.qc (N, H, Dq), acts.c (N, r+Dr), acts.kv_rinv (N),
        acts.payload (N, P) with P = r + Dr (+ Di under DSA: the indexer key, written by the indexer, +0 here)."""
        cfg = s["config"]
        cos, sin = self._rope_tables(x, s)
        acts = self.qkv_forward(cfg, self._weights(x), x["a"], x["pos"].long(), cos, sin)
        out = {}
        for k, v in acts.items():
            out["acts." + k] = v.reshape(-1)
        dsa = cfg["attention"].get("dsa")
        if dsa:   # the payload has the indexer key's Di columns too (+0: dsa_index_forward writes them)
            N = x["a"].shape[0]
            pay = out["acts.payload"].reshape(N, -1)
            out["acts.payload"] = torch.cat((pay, torch.zeros(N, dsa["index_dim"], dtype=pay.dtype)), 1).reshape(-1)
        return {k: _np(v) for k, v in out.items()}

    def op_attn_qkv_backward(self, x, s):
        """da (N, d) and the weight gradients by autograd through qkv_forward, from dqc (N, H, Dq) and the rounded
        payload gradient dpayload (N, P) (its DSA indexer-key columns belong to the indexer: not used here); the
        saved activations (acts.*) are recomputed. Weight gradients sum the rows segs[0]..segs[-1]."""
        cfg = s["config"]
        att, mla = self._att(cfg)
        cos, sin = self._rope_tables(x, s)
        a = x["a"]
        N = a.shape[0]
        W = {k: v.clone().requires_grad_(True) for k, v in self._weights(x).items()}
        names = ["wq", "wdkv", "kv_norm", "wuk"] if mla else ["wq", "wk", "wv"]
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        P_core = (att["kv_lora_rank"] + att["rope_dim"]) if mla else 2 * att["kv_heads"] * att["head_dim"]

        def grads(rows, wrt_a):
            A = a[rows].clone().requires_grad_(True)
            acts = self.qkv_forward(cfg, W, A, x["pos"].long()[rows], cos, sin)
            dqc = x["dqc"].reshape(N, -1)[rows].reshape(acts["qc"].shape)
            dpay = x["dpayload"].reshape(N, -1)[rows][:, :P_core]
            wrt = [A] if wrt_a else [W[k] for k in names]
            return torch.autograd.grad((acts["qc"], acts["payload"]), wrt, (dqc, dpay), allow_unused=True)

        (da,) = grads(slice(0, N), True)
        gw = grads(slice(r0, r1), False)
        out = {"da": _np(da)}
        for k, g in zip(names, gw):
            out["G." + k] = _np(g if g is not None else torch.zeros_like(W[k]))
        return out

    def out_forward(self, cfg, W, o):
        """Output projection: MLA o (N, H, r) -> ocat (N, H*Dv) = per-head o_h wuv_h -> y = ocat wo; GQA y = o wo."""
        att, mla = self._att(cfg)
        N, H = o.shape[0], att["heads"]
        if not mla:
            return None, self.matmul(o.reshape(N, -1), W["wo"])
        r, Dv = att["kv_lora_rank"], att["v_dim"]
        wuv = W["wuv"].reshape(r, H, Dv)                                # wuv (r, H*Dv): head h = columns h*Dv..
        ocat = self.gemm_out(torch.einsum("nhr,rhv->nhv", self.operand(o.reshape(N, H, r)),
                                          self.operand(wuv))).reshape(N, H * Dv)
        return ocat, self.matmul(ocat, W["wo"])

    def op_attn_out_forward(self, x, s):
        """Adapter: acts.o flat (N, H, Dv_core); acts.ocat flat (N, H*Dv) (MLA only); y (N, d)."""
        N = s["N"]
        H = s["config"]["attention"]["heads"]
        ocat, y = self.out_forward(s["config"], self._weights(x), x["acts.o"].reshape(N, H, -1))
        out = {"y": _np(y)}
        if ocat is not None:
            out["acts.ocat"] = _np(ocat.reshape(-1))
        return out

    def op_attn_out_backward(self, x, s):
        """dO (flat (N, H, Dv_core)) and G.wo (G.wuv) by autograd through out_forward from dy (N, d); the weight
        gradients sum the rows segs[0]..segs[-1]."""
        cfg = s["config"]
        att, mla = self._att(cfg)
        N, H = s["N"], att["heads"]
        W = {k: v.clone().requires_grad_(True) for k, v in self._weights(x).items()}
        names = ["wo", "wuv"] if mla else ["wo"]
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        o_all = x["acts.o"].reshape(N, H, -1)
        dy = x["dy"].reshape(N, -1)

        o = o_all.clone().requires_grad_(True)
        _, y = self.out_forward(cfg, W, o)
        (dO,) = torch.autograd.grad(y, o, dy)
        _, y = self.out_forward(cfg, W, o_all[r0:r1])
        gw = torch.autograd.grad(y, [W[k] for k in names], dy[r0:r1])
        out = {"dO": _np(dO.reshape(-1))}
        for k, g in zip(names, gw):
            out["G." + k] = _np(g)
        return out

    # ---- zig-zag context parallelism ---------------------------------------------------------------------------
    @staticmethod
    def zigzag_slot(b, cp):
        return 2 * b if b < cp else 2 * (2 * cp - 1 - b) + 1

    def op_kv_zigzag_reorder(self, x, s):
        """src (2cp, block): dst block b = src block slot(b) (gather -> position order), or dst block slot(b) =
        src block b (to_gather); slot(b) = 2b for b < cp, 2(2cp-1-b)+1 otherwise. An index_select of blocks."""
        cp = s["cp"]
        slot = torch.tensor([self.zigzag_slot(b, cp) for b in range(2 * cp)])
        src = x["src"].reshape(2 * cp, s["block"])
        perm = torch.argsort(slot) if s["to_gather"] else slot
        return {"dst": _np(src.index_select(0, perm))}

    def op_kv_zigzag_to_gather_acc(self, x, s):
        """The accumulators x (2cp, block) from position order to gather order (block slot(b) = block b)."""
        cp = s["cp"]
        slot = torch.tensor([self.zigzag_slot(b, cp) for b in range(2 * cp)])
        src = x["x"].reshape(2 * cp, s["block"])
        return {"x": _np(src.index_select(0, torch.argsort(slot)))}

    # ---- the attention core ------------------------------------------------------------------------------------
    def to_bhsd(self, q, kv, s):
        """The golden's layout -> (B=1, H, S, D):
        q (Nq, H*Dq) -> Q (1, H, Nq, Dq); kv (S, P): key group g = columns g*Dq.., value group g = columns
        val_base + g*Dv.. -> K (1, H, S, Dq), V (1, H, S, Dv) with head h reading group h // (H/G)
        (MLA: G = 1 and the value is the first Dv columns of the key, so K and V share storage)."""
        H, G, Dq, Dv, vb = s["H"], s["G"], s["Dq"], s["Dv"], s["val_base"]
        Nq, S = q.shape[0], kv.shape[0]
        Q = q.reshape(Nq, H, Dq).transpose(0, 1).unsqueeze(0)
        K = kv[:, :G * Dq].reshape(S, G, Dq).transpose(0, 1).unsqueeze(0)
        V = kv[:, vb:vb + G * Dv].reshape(S, G, Dv).transpose(0, 1).unsqueeze(0)
        return Q, self.expand_kv(K, H // G), self.expand_kv(V, H // G)

    @staticmethod
    def from_bhsd(O):
        """(1, H, Nq, Dv) -> the golden's o (Nq, H*Dv)."""
        return O[0].transpose(0, 1).reshape(O.shape[2], -1)

    def sdpa(self, Q, K, V, allowed, scale):
        """Masked attention in (B, H, S, D): F.scaled_dot_product_attention where torch has it (>= 2.1, with
        scale=), else its math: softmax(Q K^T * scale, masked) V. Returns O and the per-row stats (m, l) of the
        scaled scores: m = max, l = sum exp(s - m) (what the golden's `stats` holds; lse = m + log l)."""
        Qo, Ko, Vo = self.operand(Q), self.operand(K), self.operand(V)
        sc = self.gemm_out(torch.matmul(Qo, Ko.transpose(-1, -2))) * scale
        sc = sc.masked_fill(~allowed, float("-inf"))
        m = sc.amax(-1, keepdim=True)
        l = torch.exp(sc - m).sum(-1)
        if HAS_SDPA and self.policy != "bf16" and type(self).softmax is TorchKernels.softmax:
            try:
                O = F.scaled_dot_product_attention(Qo, Ko, Vo, attn_mask=allowed, scale=scale)
                return O, m.squeeze(-1), l
            except TypeError:    # torch 2.0: no scale=
                pass
        p = self.softmax(sc)
        return self.gemm_out(torch.matmul(self.operand(p), Vo)), m.squeeze(-1), l

    def core(self, q, kv, qpos, qdoc, s, allowed=None):
        Q, K, V = self.to_bhsd(q, kv, s)
        if allowed is None:
            allowed = self.attn_allowed(qpos, qdoc, kv.shape[0])
        O, m, l = self.sdpa(Q, K, V, allowed, self.attn_scale(s))
        stats = torch.stack((m[0].t(), l[0].t()), -1)                  # (Nq, H, 2)
        return self.from_bhsd(O), stats

    def op_attn_core_forward(self, x, s, doc=False):
        """o (Nq, H*Dv), stats (Nq, H*2) = (m, l) per head: causal attention of the queries q (Nq, H*Dq) at global
        positions qpos over the payload kv (S, P) (row j = position j); adapters to_bhsd / from_bhsd."""
        o, stats = self.core(x["q"], x["kv"], x["qpos"].long(), x["qdoc"].long() if doc else None, s)
        return {"o": _np(o), "stats": _np(stats.reshape(o.shape[0], -1))}

    def op_attn_core_backward(self, x, s, doc=False):
        """dq (Nq, H*Dq), dkv (S, P) by autograd of the forward from dO (Nq, H*Dv) (the saved o and stats are not
        needed: the forward is recomputed). dkv is the key side summed over every query (the key and value columns
        of the payload, added where they overlap)."""
        q = x["q"].clone().requires_grad_(True)
        kv = x["kv"].clone().requires_grad_(True)
        o, _ = self.core(q, kv, x["qpos"].long(), x["qdoc"].long() if doc else None, s)
        dq, dkv = torch.autograd.grad(o, (q, kv), x["dO"].reshape(o.shape))
        return {"dq": _np(dq), "dkv": _np(dkv)}

    def op_attn_doc_core_forward(self, x, s):
        """attn_core_forward under the document mask: query r sees keys qdoc[r]..qpos[r]."""
        return self.op_attn_core_forward(x, s, doc=True)

    def op_attn_doc_core_backward(self, x, s):
        return self.op_attn_core_backward(x, s, doc=True)

    # ---- DSA -----------------------------------------------------------------------------------------------------
    def index_scores(self, iq, kv, s):
        """The DSA indexer: iq (Nq, Hi*Di + Hi) = Hi queries of Di, then Hi weights; the indexer key of position j
        is kv[j, ikey:ikey+Di]. I (Nq, S) = sum_t w_t relu(q_t . k_j)."""
        Hi, Di, ik = s["Hi"], s["Di"], s["ikey"]
        Nq = iq.shape[0]
        qi = iq[:, :Hi * Di].reshape(Nq, Hi, Di)
        w = iq[:, Hi * Di:]
        z = self.gemm_out(torch.einsum("ntc,sc->nts", self.operand(qi), self.operand(kv[:, ik:ik + Di])))
        return (w.unsqueeze(-1) * torch.relu(z)).sum(1)

    def op_dsa_select(self, x, s):
        """sel (Nq, topk) int32: the topk keys of highest index score among [qdoc, qpos] (ties to the lower
        position), ascending, -1 padded where a query has fewer keys."""
        k = s["topk"]
        qpos = x["qpos"].long()
        qdoc = x["qdoc"].long() if "qdoc" in x else None
        S = x["kv"].shape[0]
        I = self.index_scores(x["iq"], x["kv"], s)
        ok = self.attn_allowed(qpos, qdoc, S)
        idx = self.topk_desc(I.masked_fill(~ok, float("-inf")), min(k, S))
        n = ok.sum(1, keepdim=True)
        idx = torch.where(torch.arange(idx.shape[1])[None, :] < n, idx, torch.full_like(idx, S))
        idx = idx.sort(dim=-1).values
        sel = torch.full((qpos.shape[0], k), -1, dtype=torch.int64)
        sel[:, :idx.shape[1]] = torch.where(idx < S, idx, torch.full_like(idx, -1))
        return {"sel": _np(sel, np.int32)}

    def dsa_forward(self, q, iq, kv, x, s):
        """o, stats as the core over the selected keys only; the per-query indexer KL loss KL(p || softmax(I)) over
        the selected keys (p: the attention probabilities averaged over heads, detached)."""
        sel = x["sel"].long()
        valid = sel >= 0
        Nq, S = q.shape[0], kv.shape[0]
        allowed = torch.zeros(Nq, S + 1, dtype=torch.bool)                 # column S: the -1 padding
        allowed.scatter_(1, torch.where(valid, sel, torch.full_like(sel, S)), True)
        allowed = allowed[:, :S]
        Q, K, V = self.to_bhsd(q, kv, s)
        sc = self.gemm_out(torch.matmul(self.operand(Q), self.operand(K).transpose(-1, -2))) * self.attn_scale(s)
        sc = sc.masked_fill(~allowed, float("-inf"))
        p = self.softmax(sc)                                             # (1, H, Nq, S)
        O = self.gemm_out(torch.matmul(self.operand(p), self.operand(V)))
        m = sc.amax(-1)
        l = torch.exp(sc - m.unsqueeze(-1)).sum(-1)
        stats = torch.stack((m[0].t(), l[0].t()), -1)
        pbar = p[0].mean(0).detach().gather(1, sel.clamp(min=0)).masked_fill(~valid, 0.0)
        I = self.index_scores(iq, kv, s).gather(1, sel.clamp(min=0))
        logq = torch.log_softmax(I.masked_fill(~valid, float("-inf")), -1).masked_fill(~valid, 0.0)
        kl = F.kl_div(logq, pbar, reduction="none").sum(-1)
        return self.from_bhsd(O), stats, kl

    def op_dsa_core_forward(self, x, s):
        """o (Nq, H*Dv), stats (Nq, H*2) and ikl (Nq): sparse attention over sel (Nq, topk) and the indexer's KL."""
        o, stats, kl = self.dsa_forward(x["q"], x["iq"], x["kv"], x, s)
        return {"o": _np(o), "stats": _np(stats.reshape(o.shape[0], -1)), "ikl": _np(kl)}

    def op_dsa_core_backward(self, x, s):
        """dq, diq (Nq, Hi*Di + Hi), dkv (S, P) by autograd of o (upstream dO) plus iscale * sum of the indexer KL
        (the attention probabilities detached: the indexer loss trains the indexer only)."""
        q = x["q"].clone().requires_grad_(True)
        iq = x["iq"].clone().requires_grad_(True)
        kv = x["kv"].clone().requires_grad_(True)
        o, _, kl = self.dsa_forward(q, iq, kv, x, s)
        loss = (o * x["dO"].reshape(o.shape)).sum() + s["iscale"] * kl.sum()
        dq, diq, dkv = torch.autograd.grad(loss, (q, iq, kv))
        return {"dq": _np(dq), "diq": _np(diq), "dkv": _np(dkv)}

    # ---- loss and optimizer ------------------------------------------------------------------------------------
    def op_linear_ce_forward(self, x, s):
        """LM head + cross-entropy: logits (N, V) = hidden (N, d) W (d, V) (materialised: the chunk sizes only
        change the reference's order); lse = logsumexp; token_loss = F.cross_entropy(..., reduction='none',
        ignore_index=-100) (0 for ignored rows)."""
        logits = self.ce_logits(self.matmul(x["hidden"], x["W"]))
        tgt = x["targets"].long()
        loss = F.cross_entropy(logits, tgt, ignore_index=self.ce_ignore_index(), reduction="none")
        return {"token_loss": _np(loss), "lse": _np(torch.logsumexp(logits, -1))}

    def op_linear_ce_backward(self, x, s):
        """The columns [j_begin, j_end) of the backward of grad_scale * sum of F.cross_entropy: dlogits by autograd
        (the saved lse is not needed); dhidden (N, d) = (dhidden given, when j_begin > 0) + dlogits[:, cols]
        W[:, cols]^T; dW (d, j_end - j_begin) = hidden[rows]^T dlogits[rows, cols], rows segs[0]..segs[-1]."""
        jb, je, V = s["j_begin"], s["j_end"], s["V"]
        hidden, W = x["hidden"], x["W"]
        tgt = x["targets"].long()
        logits = self.ce_logits(self.matmul(hidden, W)).detach().requires_grad_(True)
        loss = F.cross_entropy(logits, tgt, ignore_index=self.ce_ignore_index(), reduction="sum")
        (dl,) = torch.autograd.grad(loss * s["grad_scale"], logits)
        dlc = dl[:, jb:je]
        dh = self.matmul(dlc, W[:, jb:je].t())
        if jb > 0:
            dh = x["dhidden"] + dh
        if je == V:
            dh = dh.masked_fill((tgt == -100).unsqueeze(1), 0.0)
        segs = x["segs"].tolist()
        r0, r1 = (segs[0], segs[-1]) if segs else (0, 0)
        dW = self.matmul(hidden[r0:r1].t(), dlc[r0:r1])
        return {"dhidden": _np(dh), "dW": _np(dW)}

    def op_grad_sq_acc(self, x, s):
        """sq () float64 = sum of g^2 (the squared global gradient norm's share), in float64."""
        return {"sq": _np(x["g"].double().square().sum(), np.float64)}

    def adamw(self, s):
        """The optimizer torch would run: torch.optim.AdamW (single-tensor loop)."""
        return dict(lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"],
                    weight_decay=s["weight_decay"] if s["decay"] else 0.0)

    def op_adamw_step(self, x, s):
        """w, m, v (n) after one torch.optim.AdamW step at `step` (1-based) from the gradient g * clip (the global
        clip coefficient, applied as clip_grad_norm_ does); decay False: weight_decay 0 (biases, norms)."""
        w = x["w"].clone()
        p = torch.nn.Parameter(w)
        p.grad = x["g"] * torch.tensor(s["clip"], dtype=self.dtype)
        opt = torch.optim.AdamW([p], foreach=False, **self.adamw(s))
        opt.state[p] = {"step": torch.tensor(float(s["step"] - 1)), "exp_avg": x["m"].clone(),
                        "exp_avg_sq": x["v"].clone()}
        opt.step()
        st = opt.state[p]
        return {"w": _np(p.data), "m": _np(st["exp_avg"]), "v": _np(st["exp_avg_sq"])}

    def bias_sign(self, load):
        """+1 for experts below the mean load, -1 above, 0 at it (integer comparison load * E vs total)."""
        E = load.shape[0]
        return torch.sign(load.sum() - load * E)

    def op_router_bias_update(self, x, s):
        """b (E) += gamma * sign(mean load - load): the aux-loss-free balancing update."""
        sign = self.bias_sign(x["load"].long()).to(self.dtype)
        gamma = torch.tensor(s["gamma"], dtype=self.dtype)
        b = x["b"]
        return {"b": _np(torch.where(sign == 0, b, b + gamma * sign))}


_INSTANCES = {}


def kernels_for(policy="fp32"):
    """The TorchKernels instance for a case's policy ("fp32", "bf16", "fp64")."""
    if policy not in _INSTANCES:
        _INSTANCES[policy] = TorchKernels(policy)
    return _INSTANCES[policy]


def kernels(op, inputs, shapes):
    """impl(op, inputs, shapes) for trident_golden.check: the kernel set of the case's precision policy (the checker
    passes it as shapes["policy"] for the ops that take one; fp32 otherwise)."""
    return kernels_for(shapes.get("policy") or "fp32")(op, inputs, shapes)
