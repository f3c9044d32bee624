"""Checks an implementation of Kernels<T> ops against primitive goldens.

An implementation is a function impl(op, inputs, shapes) -> dict of outputs, or None for an op it does not
implement (skipped). `inputs` maps each input name to a numpy array (the golden's dtype and shape), `shapes` holds the
scalar arguments. Outputs it returns are compared with the golden: under the stored error bound
|got - want| <= (k_const + k_per_term * n_terms) * u * sum_abs where the golden stores one (sum_abs), bit for bit
otherwise. Outputs it does not return are not compared."""
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
    bound: float          # -1: bitwise
    message: str
    repro: str


@dataclass
class Result:
    checked: int = 0
    passed: int = 0
    skipped: int = 0
    failures: list = field(default_factory=list)
    sealed: bool = True   # the golden had the checksum and the case manifest

    @property
    def ok(self):
        return not self.failures and self.checked > 0


def compare(case, name, got, want):
    """(index, got, want, bound) of the worst violation, or None."""
    got = np.asarray(got)
    if got.shape != want.shape:
        got = got.reshape(want.shape) if got.size == want.size else got
    if got.shape != want.shape:
        return (-1, float("nan"), float("nan"), -1.0)
    bound = case.bound(name)
    g = got.astype(want.dtype, copy=False).ravel()
    w = want.ravel()
    if bound is None:
        same = (g.view(np.uint8).reshape(g.size, -1) == w.view(np.uint8).reshape(w.size, -1)).all(axis=1) \
            if g.size else np.ones(0, bool)
        bad = np.flatnonzero(~same)
        if bad.size == 0:
            return None
        i = int(bad[0])
        return (i, float(g[i]), float(w[i]), -1.0)
    err = np.abs(g.astype(np.float64) - w.astype(np.float64))
    b = bound.ravel()
    viol = ~(err <= b)
    if not viol.any():
        return None
    ratio = np.where(b > 0, err / np.where(b > 0, b, 1), np.inf)
    ratio = np.where(np.isnan(err), np.inf, ratio)
    i = int(np.argmax(np.where(viol, ratio, -1)))
    return (i, float(g[i]), float(w[i]), float(b[i]))


def check(golden, impl, op=None, case=None, rank=None, impl_name="module:function"):
    """Runs impl on every case of `golden` (a path or a Primitives) matching the filters and compares. Returns a
    Result. A filter that matches nothing raises NotFound (a KeyError) listing the ops, cases or ranks there are."""
    g = load_primitives(golden) if isinstance(golden, (str, os.PathLike)) else golden
    res = Result()
    res.sealed = getattr(g, "sealed", False)
    for c in g.select(op or None, case or None, rank):
        out = impl(c.op, {k: v.copy() for k, v in c.inputs.items()}, dict(c.shapes))
        if out is None:
            res.skipped += 1
            continue
        res.checked += 1
        repro = f"python -m trident_golden check {g.path} --impl {impl_name} --op {c.op} --case {c.name}" + \
            (f" --rank {c.rank}" if c.rank else "")
        failed = None
        for name, got in out.items():
            if name not in c.outputs:
                failed = Failure(c.op, c.name, c.rank, name, -1, 0.0, 0.0, -1.0,
                                 f"{c.op}/{c.name} (rank {c.rank}): the golden has no output '{name}' "
                                 f"(outputs: {', '.join(c.outputs)})", repro)
                break
            v = compare(c, name, got, c.outputs[name])
            if v is None:
                continue
            i, x, y, b = v
            if i < 0:
                msg = f"{c.op}/{c.name} (rank {c.rank}): output '{name}' has shape {np.shape(got)}, golden " \
                      f"{c.outputs[name].shape}"
            elif b < 0:
                msg = f"{c.op}/{c.name} (rank {c.rank}): output '{name}' differs at element {i}: got {x!r}, " \
                      f"golden {y!r} (bitwise: no error bound stored for this output)"
            else:
                msg = f"{c.op}/{c.name} (rank {c.rank}): output '{name}' element {i}: got {x!r}, golden {y!r}, " \
                      f"|err| {abs(x - y):.6g} > bound {b:.6g}"
            failed = Failure(c.op, c.name, c.rank, name, i, x, y, b, msg, repro)
            break
        if failed:
            res.failures.append(failed)
        else:
            res.passed += 1
    return res
