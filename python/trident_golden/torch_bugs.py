"""Planted bugs: the ways real kernels go wrong, each one change to trident_golden.torch_ops (docs/torch.md).

Every entry of BUGS is a Bug: a name, the ops it touches, a one-line description, and a TorchKernels subclass that
overrides one hook or one op. `bug.impl()` returns an implementation impl(op, inputs, shapes) for
trident_golden.check: the buggy kernel for the bug's ops, torch_ops.kernels for every other op.

    python3 -m trident_golden.torch_bugs                 # every bug against the five checked-in goldens
    python3 -m trident_golden.torch_bugs --markdown      # the table of docs/torch.md

For each bug and golden, run() reports whether the golden checker (trident_golden.check, whatever rule it applies)
fails it, whether it differs from the golden beyond the sanity scale of torch_report (an output with
max |err| > 64 u max |golden|, or an integer output that differs), and whether two common tolerance checks would
have MISSED it: numpy.allclose(atol=rtol=1e-2) and torch.testing.assert_close with its defaults (float32: rtol
1.3e-6, atol 1e-5), applied to every output of every case of the bug's ops."""
import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from . import torch_ops
from .torch_ops import TorchKernels


@dataclass
class Bug:
    name: str
    ops: tuple
    description: str
    cls: type

    def impl(self):
        """impl(op, inputs, shapes): the bug on its ops, the honest torch kernels elsewhere. A fresh instance each
        call of impl() (bugs with state, such as a stale accumulator, start clean)."""
        buggy = self.cls()

        def run(op, inputs, shapes):
            return buggy(op, inputs, shapes) if op in self.ops else torch_ops.kernels(op, inputs, shapes)
        run.__name__ = self.name
        return run


BUGS = []


def bug(name, ops, description):
    def register(cls):
        BUGS.append(Bug(name, tuple(ops), description, cls))
        return cls
    return register


ATTN_CORE = ("attn_core_forward", "attn_core_backward", "attn_doc_core_forward", "attn_doc_core_backward")
SWIGLU = ("swiglu_forward", "swiglu_backward_dgrad", "expert_forward", "expert_backward_dgrad")


# ---- norms and activations ---------------------------------------------------------------------------------------
@bug("rmsnorm_eps_1e-5", ("rmsnorm_forward", "attn_qkv_forward"), "RMSNorm eps 1e-5 where the model says 1e-6")
class RmsEps(TorchKernels):
    def rms_eps(self, eps):
        return 1e-5 if eps == 1e-6 else 10 * eps


@bug("rmsnorm_backward_sign", ("rmsnorm_backward",), "RMSNorm backward adds the projection term instead of "
     "subtracting it: dx = rinv (dy g + xhat c)")
class RmsSign(TorchKernels):
    def rmsnorm_grad(self, X, rinv, g, dy):
        r = rinv.unsqueeze(-1)
        xhat = X * r
        dxh = dy * g
        return r * (dxh + xhat * (dxh * xhat).mean(-1, keepdim=True)), (dy * xhat).sum(0)


@bug("gelu_for_silu", SWIGLU, "GELU as the gate activation where SwiGLU needs SiLU")
class Gelu(TorchKernels):
    def act(self, x):
        return F.gelu(x)


@bug("swiglu_gate_up_swapped", SWIGLU, "silu applied to the up projection: h = silu(uu) * ug")
class GateUpSwapped(TorchKernels):
    def swiglu(self, X, wg, wu, wd):
        ug, uu = self.matmul(X, wg), self.matmul(X, wu)
        h = self.act(uu) * ug
        return ug, uu, h, self.matmul(h, wd)

    def op_swiglu_backward_dgrad(self, x, s):
        x = dict(x)
        x["ug"], x["uu"] = x["uu"], x["ug"]
        out = super().op_swiglu_backward_dgrad(x, s)
        return {"dug": out["duu"], "duu": out["dug"], "dx": out["dx"]}


@bug("missing_residual", ("residual_forward",), "the residual add returns the branch only: out = b")
class NoResidual(TorchKernels):
    def residual(self, a, b):
        return b


# ---- RoPE and attention ------------------------------------------------------------------------------------------
@bug("rope_position_off_by_one", ("attn_qkv_forward", "attn_qkv_backward"),
     "RoPE at position p + 1 (1-based positions)")
class RopeOffByOne(TorchKernels):
    def rope(self, x, cos, sin, pos):
        return super().rope(x, cos, sin, (pos + 1).clamp(max=cos.shape[0] - 1))


@bug("causal_mask_off_by_one", ATTN_CORE, "causal mask j <= pos + 1: each query sees the next token")
class CausalOffByOne(TorchKernels):
    def attn_allowed(self, qpos, qdoc, S):
        return super().attn_allowed(qpos + 1, qdoc, S)


@bug("missing_document_mask", ("attn_doc_core_forward", "attn_doc_core_backward"),
     "packed sequences without the document mask: queries attend the previous documents")
class NoDocMask(TorchKernels):
    def attn_allowed(self, qpos, qdoc, S):
        return super().attn_allowed(qpos, None, S)


@bug("softmax_scale_1/sqrt(Dv)", ATTN_CORE + ("dsa_core_forward", "dsa_core_backward"),
     "softmax scale 1/sqrt(Dv) (the value width) instead of the query's 1/sqrt(Dn + Dr)")
class ScaleDv(TorchKernels):
    def attn_scale(self, cd):
        return 1.0 / np.sqrt(cd["Dv"])


@bug("softmax_scale_missing", ATTN_CORE, "no softmax scale: softmax(q k^T)")
class ScaleMissing(TorchKernels):
    def attn_scale(self, cd):
        return 1.0


@bug("gqa_wrong_grouping", ATTN_CORE, "GQA heads mapped to KV groups by repeat (h % G) instead of "
     "repeat_interleave (h // (H/G))")
class GqaGrouping(TorchKernels):
    def expand_kv(self, k, rep):
        return k.repeat(1, rep, 1, 1)


@bug("softmax_in_fp16", ATTN_CORE, "attention scores and probabilities held in float16")
class SoftmaxFp16(TorchKernels):
    def softmax(self, s):
        return torch.softmax(s.to(torch.float16).to(s.dtype), dim=-1).to(torch.float16).to(s.dtype)


@bug("transposed_weight", ("attn_out_forward", "attn_out_backward"), "the output projection used transposed "
     "(an (out, in) nn.Linear weight read as (in, out))")
class TransposedWo(TorchKernels):
    @staticmethod
    def _weights(x):
        w = TorchKernels._weights(x)
        w["wo"] = w["wo"].t()
        return w


@bug("dsa_select_no_causal_mask", ("dsa_select",), "the DSA indexer picks its top-k among future keys too")
class DsaNoMask(TorchKernels):
    def op_dsa_select(self, x, s):
        x = dict(x)
        x["qpos"] = torch.full_like(x["qpos"], x["kv"].shape[0] - 1)
        return super().op_dsa_select(x, s)


# ---- router and MoE ----------------------------------------------------------------------------------------------
@bug("topk_picks_smallest", ("router_forward", "dsa_select"), "top-k by ascending sort: the smallest scores")
class TopkSmallest(TorchKernels):
    def topk_desc(self, scores, k):
        return torch.sort(scores.masked_fill(torch.isinf(scores), float("inf")), dim=-1, stable=True).indices[..., :k]


@bug("gates_not_renormalised", ("router_forward", "router_backward"),
     "the router's gates are the raw sigmoid scores (no division by their sum)")
class GatesRaw(TorchKernels):
    def router_gates(self, s_sel, alpha):
        return alpha * s_sel


@bug("expert_drops_token", ("expert_forward",), "an expert at capacity drops its last token (output row +0)")
class DropToken(TorchKernels):
    def op_expert_forward(self, x, s):
        out = super().op_expert_forward(x, s)
        if out["y"].shape[0] > 1:
            out["y"][-1] = 0
        return out


@bug("router_bias_update_sign", ("router_bias_update",), "the balancing update raises the bias of overloaded "
     "experts")
class BiasSign(TorchKernels):
    def bias_sign(self, load):
        return -super().bias_sign(load)


@bug("gather_rows_off_by_one", ("gather_rows", "scatter_rows"), "row indices shifted by one (1-based indices)")
class GatherOffByOne(TorchKernels):
    def gather_index(self, idx, rows):
        return (idx + 1).clamp(max=max(rows - 1, 0))     # clamped: the shifted index stays in bounds


# ---- loss and optimizer ------------------------------------------------------------------------------------------
@bug("ce_ignore_index_ignored", ("linear_ce_forward", "linear_ce_backward"),
     "padding targets (-100) trained as token 0 instead of ignored")
class CeNoIgnore(TorchKernels):
    def op_linear_ce_forward(self, x, s):
        return super().op_linear_ce_forward(self._pad_as_zero(x), s)

    def op_linear_ce_backward(self, x, s):
        return super().op_linear_ce_backward(self._pad_as_zero(x), s)

    @staticmethod
    def _pad_as_zero(x):
        x = dict(x)
        x["targets"] = x["targets"].clamp(min=0)
        return x


@bug("ce_logits_in_bf16", ("linear_ce_forward", "linear_ce_backward"), "the LM head's logits rounded to bfloat16 "
     "before the cross-entropy")
class CeBf16(TorchKernels):
    def ce_logits(self, logits):
        return logits.to(torch.bfloat16).to(logits.dtype)


@bug("ce_double_mean", ("linear_ce_backward",), "reduction='mean' and grad_scale both applied (the loss "
     "gradient divided by the token count twice)")
class CeDoubleMean(TorchKernels):
    def op_linear_ce_backward(self, x, s):
        s = dict(s)
        n = int((x["targets"] != -100).sum())
        s["grad_scale"] = s["grad_scale"] / max(n, 1)
        return super().op_linear_ce_backward(x, s)


@bug("ce_dhidden_not_continued", ("linear_ce_backward",), "a later vocabulary slice overwrites dhidden instead "
     "of adding to the preceding slices' sum")
class CeNotContinued(TorchKernels):
    def op_linear_ce_backward(self, x, s):
        x = dict(x)
        x["dhidden"] = torch.zeros_like(x["dhidden"])     # the incoming partial sum dropped
        return super().op_linear_ce_backward(x, s)


@bug("stale_accumulator", ("wgrad_acc", "embedding_backward", "sum_acc"), "the gradient accumulator is not "
     "zeroed between calls: each call adds onto the previous call's result")
class StaleAcc(TorchKernels):
    def __init__(self):
        super().__init__()
        self.buffers = {}

    def __call__(self, op, inputs, shapes):
        out = super().__call__(op, inputs, shapes)
        for k, v in out.items():
            prev = self.buffers.get((op, k))
            if prev is not None and prev.shape == v.shape:
                v = v + prev
            self.buffers[(op, k)] = v
            out[k] = v
        return out


@bug("adamw_bias_correction_step_off_by_one", ("adamw_step",), "bias correction with step + 1 (the step count "
     "incremented twice)")
class AdamStep(TorchKernels):
    def op_adamw_step(self, x, s):
        return super().op_adamw_step(x, dict(s, step=s["step"] + 1))


@bug("adamw_l2_not_decoupled", ("adamw_step",), "weight decay added to the gradient (torch.optim.Adam's L2) "
     "instead of decoupled AdamW decay")
class AdamL2(TorchKernels):
    def op_adamw_step(self, x, s):
        w = x["w"].clone()
        p = torch.nn.Parameter(w)
        p.grad = x["g"] * torch.tensor(s["clip"], dtype=self.dtype)
        opt = torch.optim.Adam([p], lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"],
                               weight_decay=s["weight_decay"] if s["decay"] else 0.0, foreach=False)
        opt.state[p] = {"step": torch.tensor(float(s["step"] - 1)), "exp_avg": x["m"].clone(),
                        "exp_avg_sq": x["v"].clone()}
        opt.step()
        st = opt.state[p]
        return {"w": p.data.numpy().copy(), "m": st["exp_avg"].numpy().copy(), "v": st["exp_avg_sq"].numpy().copy()}


@bug("adamw_decay_ignores_flag", ("adamw_step",), "weight decay applied to every tensor, biases and norm gains "
     "too (the decay flag ignored)")
class AdamDecayAll(TorchKernels):
    def op_adamw_step(self, x, s):
        return super().op_adamw_step(x, dict(s, decay=True))


@bug("adamw_eps_1e-6", ("adamw_step",), "AdamW eps 1e-6 (another framework's default) where the config says 1e-8")
class AdamEps(TorchKernels):
    def adamw(self, s):
        return dict(super().adamw(s), eps=1e-6)


@bug("wgrad_bf16_operands", ("wgrad_acc",), "the weight gradient's GEMM fed bfloat16 operands under the fp32 "
     "policy (an autocast region left on)")
class WgradBf16(TorchKernels):
    def op_wgrad_acc(self, x, s):
        return TorchKernels("bf16").op_wgrad_acc(x, s)


@bug("attn_backward_recompute_fp16", ("attn_core_backward", "attn_doc_core_backward"), "the backward recomputes "
     "the attention probabilities in float16 (the forward is right)")
class AttnBwdFp16(SoftmaxFp16):
    pass


@bug("ce_backward_logits_bf16", ("linear_ce_backward",), "the backward recomputes the logits in bfloat16 (the "
     "forward is right)")
class CeBwdBf16(CeBf16):
    pass


# ---- running the catalogue -----------------------------------------------------------------------------------------
def _close_numpy(got, want):
    return np.allclose(got, want, rtol=1e-2, atol=1e-2, equal_nan=False)


def _close_torch(got, want):
    try:
        torch.testing.assert_close(torch.from_numpy(np.ascontiguousarray(got)),
                                   torch.from_numpy(np.ascontiguousarray(want)))
        return True
    except AssertionError:
        return False


def outcome(make_impl, golden, ops):
    """One implementation on one golden, over the cases of `ops`. make_impl() returns a fresh impl (a bug with
    state starts clean for each pass). A dict: cases (how many ran); sanity (some output beyond the
    sanity scale of torch_report.beyond_sanity, or an integer output that differs); worst (the largest
    max |err| / (u max |golden|)); allclose_missed / assert_close_missed (every output of every case passes
    numpy.allclose(atol=rtol=1e-2) / torch.testing.assert_close's defaults); checker_failed (trident_golden.check,
    with its current rule, reports a failure)."""
    from .check import check
    from .torch_report import beyond_sanity
    cases = [c for c in golden.cases if c.op in ops]
    res = {"cases": len(cases), "sanity": False, "allclose_missed": True, "assert_close_missed": True,
           "checker_failed": False, "worst": 0.0, "failure": ""}
    if not cases:
        return res
    impl = make_impl()
    for c in cases:
        out = impl(c.op, {k: v.copy() for k, v in c.inputs.items()}, dict(c.shapes))
        for name, want in c.outputs.items():
            got = np.asarray(out[name])
            if got.size != want.size:
                res.update(sanity=True, allclose_missed=False, assert_close_missed=False, worst=float("inf"))
                continue
            got = got.reshape(want.shape).astype(want.dtype, copy=False)
            bad, ratio = beyond_sanity(got, want)
            res["worst"] = max(res["worst"], ratio)
            res["sanity"] |= bad
            res["allclose_missed"] &= _close_numpy(got, want)
            res["assert_close_missed"] &= _close_torch(got, want)
    for op in sorted(set(ops) & {c.op for c in cases}):
        failures = check(golden, make_impl(), op=op).failures
        res["checker_failed"] |= bool(failures)
        if failures and not res["failure"]:
            res["failure"] = failures[0].message   # the checker's first FAIL line for this bug on this golden
    return res


def run(goldens=None, bugs=None):
    """[(bug, {golden name: outcome})] for every bug on every golden (default: the five checked-in goldens)."""
    from .reader import load_primitives
    from .torch_report import default_goldens
    gs = [(name, load_primitives(path)) for name, path in (goldens or default_goldens())]
    return [(b, {name: outcome(b.impl, g, b.ops) for name, g in gs}) for b in bugs or BUGS]


def table(rows, markdown=False):
    """The catalogue's outcomes, one row per bug: where the sanity scale detects it (`all` = every golden given),
    where the golden checker fails it, the worst max |err| / (u max|golden|), and whether numpy.allclose(1e-2) /
    torch.testing.assert_close (defaults) would have missed it on every golden."""
    head = ["bug", "ops", "detected on (64 u scale)", "checker fails on", "worst err / (u max)",
            "allclose 1e-2", "assert_close", "description"]
    lines = []

    def where(names, per):
        return "all" if names and len(names) == len(per) else (", ".join(names) or "NONE")
    for b, per in rows:
        det = [g for g, o in per.items() if o["sanity"]]
        chk = [g for g, o in per.items() if o["checker_failed"]]
        ran = [o for o in per.values() if o["cases"]]
        worst = max((o["worst"] for o in ran), default=0.0)
        lines.append([b.name, ", ".join(b.ops), where(det, per), where(chk, per).replace("NONE", "none"),
                      "inf" if worst == float("inf") else f"{worst:.3g}",
                      "MISSED" if all(o["allclose_missed"] for o in ran) else "caught",
                      "MISSED" if all(o["assert_close_missed"] for o in ran) else "caught", b.description])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in lines]
        return "\n".join(out)
    w = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head[:-1])]
    fmt = lambda cols: "  ".join(c.ljust(w[i]) for i, c in enumerate(cols[:-1])) + "  " + cols[-1]
    return "\n".join([fmt(head)] + [fmt(line) for line in lines])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m trident_golden.torch_bugs",
                                description="Run the planted bugs of torch_bugs.BUGS against primitive goldens.")
    p.add_argument("goldens", nargs="*", help="golden directories (default: the five checked-in goldens)")
    p.add_argument("--markdown", action="store_true", help="a markdown table (docs/torch.md)")
    p.add_argument("--bug", action="append", help="only this bug (repeatable)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)    # one reduction order: the table does not change with the machine's cores
    gs = [(g.rstrip("/").split("/")[-1], g) for g in a.goldens] or None
    bugs = [b for b in BUGS if not a.bug or b.name in a.bug]
    rows = run(gs, bugs)
    print(table(rows, a.markdown))
    if a.bug and not a.markdown:   # the checker's verdict per golden, and the line that reruns it
        for b, per in rows:
            for name, o in per.items():
                if o["failure"]:
                    where = dict(gs or [])
                    print(f"FAIL [{b.name} on {name}] {o['failure']}")
                    print(f"  repro: PYTHONPATH=python python3 -m trident_golden.torch_bugs --bug '{b.name}'"
                          + (f" {where[name]}" if name in where else ""))
    undetected = [b.name for b, per in rows if not any(o["sanity"] for o in per.values())]
    unfailed = [b.name for b, per in rows if not any(o["checker_failed"] for o in per.values())]
    if undetected or unfailed:
        if undetected:
            print(f"\nnot detected on any golden: {', '.join(undetected)}", file=sys.stderr)
        if unfailed:
            print(f"\npassing the acceptance rule on every golden: {', '.join(unfailed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
