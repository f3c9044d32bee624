"""How far the PyTorch kernel set (torch_ops) is from the goldens: one row per op and output, over every case of
every golden given (docs/torch.md "Measured").

    python3 -m trident_golden.torch_report                    # the five checked-in goldens
    python3 -m trident_golden.torch_report GOLDEN_DIR ...     # others
    python3 -m trident_golden.torch_report --markdown         # the table of docs/torch.md

Columns: max |err| = max |torch - golden| over the elements; ratio = max |err| / (u max |golden|) per case and
output (u = 2^-24 for float32, 2^-53 for float64; 0 when both are zero), the worst over cases and goldens; bitwise
= every case equal bit for bit. Integer outputs (selections) show "exact" or the number of differing elements.

The sanity check of the tests (beyond_sanity) flags an output whose ratio exceeds 64 or that holds a
NaN the golden does not: a loose scale that catches wrong math, NOT the acceptance rule (the golden checker,
trident_golden.check, applies that)."""
import argparse
import os
import sys

import numpy as np

SANITY = 64          # the sanity scale: max |err| <= SANITY * u * max |golden| per output
GOLDENS = ("tiny", "tiny-gqa", "tiny-e64", "tiny-dsa", "tiny-packed")


def default_goldens():
    """[(name, path)] of the checked-in primitive goldens (golden/data/primitives/*), found from the checkout."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = os.path.join(root, "golden", "data", "primitives")
    return [(g, os.path.join(base, g)) for g in GOLDENS if os.path.exists(os.path.join(base, g))]


def unit_roundoff(dtype):
    return 2.0 ** -24 if np.dtype(dtype) == np.float32 else 2.0 ** -53


def error(got, want):
    """(max |err|, ratio = max |err| / (u max |golden|), bitwise equal) of one output; integer outputs: (number of
    differing elements, inf or 0, equal)."""
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    same = got.tobytes() == want.tobytes()
    if want.dtype.kind in "iub":
        n = int((got != want).sum())
        return float(n), (0.0 if n == 0 else float("inf")), same
    if want.size == 0:
        return 0.0, 0.0, same
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_ok = np.isnan(g) == np.isnan(w)
    if not nan_ok.all():
        return float("nan"), float("inf"), False
    err = np.where(np.isnan(w), 0.0, np.abs(g - w))
    if np.isinf(w).any() or np.isinf(g).any():
        err = np.where(g == w, 0.0, err)
    m = float(err.max())
    sc = float(np.abs(np.where(np.isfinite(w), w, 0)).max())
    if m == 0:
        return 0.0, 0.0, same
    return m, (m / (unit_roundoff(want.dtype) * sc) if sc > 0 else float("inf")), same


def beyond_sanity(got, want):
    """(bad, ratio): bad when an integer output differs or a floating one exceeds SANITY u max |golden|."""
    _, ratio, _ = error(got, want)
    return not (ratio <= SANITY), ratio


def measure(impl=None, goldens=None):
    """{(op, output): dict(max_err, ratio, bitwise, integer, cases, where)} over every case of the goldens
    ([(name, path)]; default: the checked-in ones). impl: default torch_ops.kernels."""
    from .reader import load_primitives
    if impl is None:
        from .torch_ops import kernels as impl
    rows = {}
    for name, path in goldens or default_goldens():
        g = load_primitives(path)
        for c in g.cases:
            out = impl(c.op, {k: v.copy() for k, v in c.inputs.items()}, dict(c.shapes))
            if out is None:
                continue
            for o, want in c.outputs.items():
                r = rows.setdefault((c.op, o), {"max_err": 0.0, "ratio": 0.0, "bitwise": True, "cases": 0,
                                                "integer": want.dtype.kind in "iub", "where": ""})
                r["cases"] += 1
                got = np.asarray(out.get(o)) if o in out else None
                if got is None or got.size != want.size:
                    r.update(max_err=float("nan"), ratio=float("inf"), bitwise=False, where=f"{name}/{c.name}")
                    continue
                e, ratio, same = error(got.reshape(want.shape).astype(want.dtype, copy=False), want)
                r["bitwise"] &= same
                if not (ratio <= r["ratio"]):
                    r["ratio"], r["where"] = ratio, f"{name}/{c.name}"
                if not (e <= r["max_err"]):
                    r["max_err"] = e
    return rows


def table(rows, markdown=False):
    from .torch_ops import TorchKernels
    order = {op: i for i, op in enumerate(TorchKernels.OPS)}
    head = ["op", "output", "max |err|", "max |err| / (u max|golden|)", "bitwise", "worst case"]
    lines = []
    for (op, o), r in sorted(rows.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][0])):
        if r["integer"]:
            err = "exact" if r["max_err"] == 0 else f"{int(r['max_err'])} differ"
            ratio = "-"
        else:
            err = f"{r['max_err']:.3g}"
            ratio = f"{r['ratio']:.2f}"
        lines.append([op, o, err, ratio, "yes" if r["bitwise"] else "no", r["where"] if r["ratio"] > 0 else ""])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    w = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(line)).rstrip() for line in [head] + lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m trident_golden.torch_report",
                                description="Error of the PyTorch kernel set (trident_golden.torch_ops) against "
                                "primitive goldens, per op and output.")
    p.add_argument("goldens", nargs="*", help="golden directories (default: the five checked-in goldens)")
    p.add_argument("--markdown", action="store_true", help="a markdown table (docs/torch.md)")
    a = p.parse_args(argv)
    import torch
    torch.set_num_threads(1)    # one reduction order: the table does not change with the machine's cores
    gs = [(g.rstrip("/").split("/")[-1], g) for g in a.goldens] or None
    rows = measure(goldens=gs)
    print(table(rows, a.markdown))
    bad = [f"{op}/{o}" for (op, o), r in rows.items() if not r["ratio"] <= SANITY]
    print(f"\n{len(rows)} outputs of {len({op for op, _ in rows})} ops; worst ratio "
          f"{max(r['ratio'] for r in rows.values()):.2f}; beyond the sanity scale "
          f"({SANITY} u max|golden|): "
          f"{', '.join(bad) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
