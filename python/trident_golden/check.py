"""Checks an implementation of Kernels<T> ops against primitive goldens.

An implementation is a function impl(op, inputs, shapes) -> dict of outputs, or None for an op it does not
implement (skipped). `inputs` maps each input name to a numpy array (the golden's dtype and shape), `shapes` holds the
scalar arguments, and "policy" ("fp32", "bf16", "fp64") for the ops that take a precision policy. Outputs it returns are judged by the rule the golden stores for each (docs/golden.md "The acceptance
rule"; the same rule as `trident check`, golden/primitives/accept.cpp):

  bound    |got - oracle| <= bound per element (the fp64 oracle and the derived bound are stored in the golden), and
           rms(got - oracle) <= k_rel * rms(golden - oracle) + floor; got finite where the oracle is; not all zeros
           or constant where the golden is not
  exact    bits (copies, one IEEE rounding, integers and selections: a correct implementation cannot change them)
  sum_abs  goldens written before the derived rule: |got - golden| <= (k_const + k_per_term n) u sum_abs
  bitwise  no rule derived for the output: bits

bitwise=True compares every output bit for bit (the contract of Trident's own reference kernels). Outputs the
implementation does not return are not compared."""
import math
import os
from dataclasses import dataclass, field

import numpy as np

from .reader import load_primitives


@dataclass
class Failure:
    op: str
    case: str
    rank: int
    output: str
    index: int
    got: float
    want: float
    bound: float          # -1: bits
    message: str
    repro: str


@dataclass
class OutputStat:
    """Per (op, output): how the check went, as `trident check`'s report prints it."""
    rule: str = ""
    cases: int = 0
    passed: int = 0
    worst_ratio: float = 0.0   # worst |err| / bound (bits: inf where they differ)
    worst_rel: float = -1.0    # worst relative-test ratio (-1: not run)


@dataclass
class Result:
    checked: int = 0
    passed: int = 0
    skipped: int = 0
    failures: list = field(default_factory=list)
    sealed: bool = True   # the golden had the checksum and the case manifest
    report: dict = field(default_factory=dict)   # (op, output) -> OutputStat

    @property
    def ok(self):
        return not self.failures and self.checked > 0

    def report_json(self):
        def num(x):
            return x if math.isfinite(x) else "inf"
        return [{"op": op, "output": out, "rule": s.rule, "cases": s.cases, "passed": s.passed,
                 "worst_err_over_bound": num(s.worst_ratio),
                 "worst_relative": None if s.worst_rel < 0 else num(s.worst_rel),
                 "status": "PASS" if s.passed == s.cases else "FAIL"} for (op, out), s in sorted(self.report.items())]

    def report_text(self):
        lines = [f"{'op':<24} {'output':<11} {'rule':<8} {'cases':>6} {'err/bound':>12} {'relative':>10}  status"]
        for (op, out), s in sorted(self.report.items()):
            bits = s.rule in ("exact", "bitwise")
            ratio = ("differs" if s.worst_ratio > 0 else "equal") if bits else \
                (f"{s.worst_ratio:.3g}" if math.isfinite(s.worst_ratio) else "inf")
            rel = "-" if s.worst_rel < 0 else (f"{s.worst_rel:.3g}" if math.isfinite(s.worst_rel) else "inf")
            status = "PASS" if s.passed == s.cases else f"FAIL ({s.cases - s.passed} of {s.cases})"
            lines.append(f"{op:<24} {out:<11} {s.rule:<8} {s.cases:>6} {ratio:>12} {rel:>10}  {status}")
        return "\n".join(lines)


@dataclass
class Verdict:
    rule: str
    ok: bool = True
    index: int = -1
    got: float = 0.0
    want: float = 0.0
    bound: float = -1.0
    worst_ratio: float = 0.0
    rel_ratio: float = -1.0
    why: str = ""          # the message's tail when not ok


def judge(case, name, got, bitwise=False):
    """The verdict of output `name` of `case` for the implementation's array `got`."""
    want = case.outputs[name]
    got = np.asarray(got)
    if got.shape != want.shape and got.size == want.size:
        got = got.reshape(want.shape)
    if got.shape != want.shape:
        return Verdict("shape", ok=False, worst_ratio=math.inf,
                       why=f"has shape {got.shape}, golden {want.shape}")
    rule = "bitwise" if bitwise else case.rule(name)
    g = got.astype(want.dtype, copy=False).ravel()
    w = want.ravel()
    if rule in ("exact", "bitwise"):
        same = (g.view(np.uint8).reshape(g.size, -1) == w.view(np.uint8).reshape(w.size, -1)).all(axis=1) \
            if g.size else np.ones(0, bool)
        bad = np.flatnonzero(~same)
        if bad.size == 0:
            return Verdict(rule)
        i = int(bad[0])
        tail = {"bitwise": "bitwise" + ("" if bitwise else ": no derived rule for this output yet"),
                "exact": "exact rule: a correct implementation gives these bits"}[rule]
        why = f"differs at element {i}: got {float(g[i])!r}, golden {float(w[i])!r} ({tail})"
        margins = case.accept.get(name, {}).get("margins") if not bitwise else None
        if margins and want.ndim == 2 and want.shape[1] > 0 and i // want.shape[1] < len(margins):
            row = i // want.shape[1]   # a selection: its row's tie margin says whether the golden can judge it
            m = margins[row]
            why += f"; row {row}'s top-k margin is {m:.3g} times its scores' bounds, so no correct router selects " \
                   f"differently" if m > 1 else f"; row {row} is a near tie (margin {m:.3g} times its scores' " \
                   f"bounds): a correct router may select either, so this golden cannot judge it"
        return Verdict(rule, ok=False, index=i, got=float(g[i]), want=float(w[i]), worst_ratio=math.inf, why=why)
    gd = g.astype(np.float64)
    if rule == "sum_abs":
        t = case.tolerance[name]
        b = ((t["k_const"] + t["k_per_term"] * case.n_terms[name]) * t["u"] *
             case.sum_abs[name].astype(np.float64)).ravel()
        err = np.abs(gd - w.astype(np.float64))
        ratio = np.where(err == 0, 0.0, np.where(b > 0, err / np.where(b > 0, b, 1), np.inf))
        ratio = np.where(np.isnan(err), np.inf, ratio)
        i = int(np.argmax(ratio)) if ratio.size else 0
        v = Verdict(rule, index=i, worst_ratio=float(ratio[i]) if ratio.size else 0.0)
        if ratio.size and not ratio[i] <= 1:
            v.ok, v.got, v.want, v.bound = False, float(g[i]), float(w[i]), float(b[i])
            v.why = f"element {i}: got {v.got!r}, golden {v.want!r}, |err| {abs(v.got - v.want):.6g} > bound {v.bound:.6g}"
        return v
    # the derived rule
    a = case.accept[name]
    o = case.oracle[name].astype(np.float64).ravel()
    b = case.bounds[name].astype(np.float64).ravel()
    v = Verdict(rule)
    nonfinite = np.flatnonzero(np.isfinite(o) & ~np.isfinite(gd))
    if nonfinite.size:
        i = int(nonfinite[0])
        return Verdict(rule, ok=False, index=i, got=float(g[i]), want=float(w[i]), bound=float(b[i]),
                       worst_ratio=math.inf,
                       why=f"element {i} is {float(g[i])!r} where the golden is {float(w[i])!r} (non-finite)")
    err = np.abs(gd - o)
    ratio = np.where(err == 0, 0.0, np.where(b > 0, err / np.where(b > 0, b, 1), np.inf))
    if ratio.size:
        i = int(np.argmax(ratio))
        v.index, v.worst_ratio, v.got, v.want, v.bound = i, float(ratio[i]), float(g[i]), float(w[i]), float(b[i])
    fin = np.isfinite(o)
    n = max(g.size, 1)
    eg = math.sqrt(float(np.sum((gd - o)[fin] ** 2)) / n)
    er = math.sqrt(float(np.sum((w.astype(np.float64) - o)[fin] ** 2)) / n)
    limit = a.get("k_rel", 4.0) * er + a.get("floor", 0.0)
    v.rel_ratio = eg / limit if limit > 0 else (math.inf if eg > 0 else 0.0)
    if not v.worst_ratio <= 1:
        v.ok = False
        v.why = f"element {v.index}: got {v.got!r}, golden {v.want!r}, |got - fp64| {abs(v.got - o[v.index]):.6g} " \
                f"> bound {v.bound:.6g} ({a.get('row', '')} rule)"
    elif not v.rel_ratio <= 1:
        v.ok = False
        v.why = f"rms error vs fp64 {eg:.6g} > {a.get('k_rel', 4.0):g} x the reference's {er:.6g} + floor " \
                f"{a.get('floor', 0.0):.6g} (relative test)"
    elif g.size > 1 and np.any(w != 0) and np.all(g == 0):
        v.ok, v.why = False, "is all zeros where the golden is not (degenerate output)"
    elif g.size > 1 and np.any(w != w[0]) and np.all(g == g[0]):
        v.ok, v.why = False, "is constant where the golden is not (degenerate output)"
    return v


def compare(case, name, got, bitwise=False):
    """(index, got, want, bound) of the worst violation, or None (bound -1: bits)."""
    v = judge(case, name, got, bitwise)
    return None if v.ok else (v.index, v.got, v.want, v.bound)


def check(golden, impl, op=None, case=None, rank=None, impl_name="module:function", bitwise=False):
    """Runs impl on every case of `golden` (a path or a Primitives) matching the filters and judges every output it
    returns. Returns a Result (with a per-(op, output) report). A filter that matches nothing raises NotFound (a
    KeyError) listing the ops, cases or ranks there are."""
    g = load_primitives(golden) if isinstance(golden, (str, os.PathLike)) else golden
    res = Result()
    res.sealed = getattr(g, "sealed", False)
    for c in g.select(op or None, case or None, rank):
        shapes = dict(c.shapes)
        if c.policy:
            shapes["policy"] = c.policy   # the op's precision policy argument ("fp32", "bf16", "fp64")
        out = impl(c.op, {k: v.copy() for k, v in c.inputs.items()}, shapes)
        if out is None:
            res.skipped += 1
            continue
        res.checked += 1
        repro = f"python -m trident_golden check {g.path} --impl {impl_name} --op {c.op} --case {c.name}" + \
            (f" --rank {c.rank}" if c.rank else "") + (" --bitwise" if bitwise else "")
        failed = None
        for name, got in out.items():
            if name not in c.outputs:
                failed = failed or Failure(c.op, c.name, c.rank, name, -1, 0.0, 0.0, -1.0,
                                           f"{c.op}/{c.name} (rank {c.rank}): the golden has no output '{name}' "
                                           f"(outputs: {', '.join(c.outputs)})", repro)
                continue
            v = judge(c, name, got, bitwise)
            s = res.report.setdefault((c.op, name), OutputStat())
            s.rule = v.rule if s.rule in ("", v.rule) else (s.rule if v.rule in s.rule.split("+") else s.rule + "+" + v.rule)
            s.cases += 1
            s.passed += 1 if v.ok else 0
            s.worst_ratio = max(s.worst_ratio, v.worst_ratio)
            s.worst_rel = max(s.worst_rel, v.rel_ratio)
            if not v.ok and failed is None:
                failed = Failure(c.op, c.name, c.rank, name, v.index, v.got, v.want, v.bound,
                                 f"{c.op}/{c.name} (rank {c.rank}): output '{name}' {v.why}", repro)
        if failed:
            res.failures.append(failed)
        else:
            res.passed += 1
    return res
