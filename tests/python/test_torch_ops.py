"""The PyTorch kernel set (trident_golden.torch_ops) against the checked-in primitive goldens (ctest label `python`).

Every op of the kernel set is implemented; every case of every checked-in golden, fp32 and bf16, passes the golden's
acceptance rule (docs/golden.md "The acceptance rule") and fails bits somewhere (so the rule is what passes it);
every integer / selection output (router and DSA `sel`) equals the golden exactly; every floating output is within
the sanity scale max |err| <= 64 u max |golden| per case and output (torch_report.SANITY), a coarse second look. The sanity check itself flags an output moved by more than the scale. The report prints
one row per op and output. Skipped (exit 77) where PyTorch is not installed."""
import io
import sys
import unittest
from contextlib import redirect_stdout

try:
    import torch
except ImportError as e:
    print(f"test_torch_ops: SKIPPED: PyTorch is not importable ({e}); apt-get install python3-torch")
    sys.exit(77)

import numpy as np

import trident_golden as tg
from trident_golden import torch_report
from trident_golden.torch_ops import TorchKernels, kernels

torch.set_num_threads(1)
GOLDENS = torch_report.default_goldens()
ROOT = __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "..", "..")
BF16_GOLDENS = [(n, f"{ROOT}/golden/data/primitives/{n}") for n in ("tiny-bf16", "tiny-dsa-bf16", "tiny-packed-bf16")]
ROWS = None


def rows():
    global ROWS
    if ROWS is None:
        ROWS = torch_report.measure(kernels, GOLDENS)
    return ROWS


class TorchOps(unittest.TestCase):
    def test_goldens_present(self):
        self.assertEqual([g for g, _ in GOLDENS], list(torch_report.GOLDENS))

    def test_every_op_implemented(self):
        ops = set()
        for _, path in GOLDENS:
            ops |= {c.op for c in tg.load_primitives(path).cases}
        self.assertEqual(len(ops), 38, sorted(ops))
        self.assertEqual(ops, set(TorchKernels.OPS))
        self.assertEqual({op for op, _ in rows()}, ops)

    def test_passes_the_acceptance_rule(self):
        for name, path in GOLDENS + BF16_GOLDENS:
            res = tg.check(path, kernels)
            self.assertEqual([f.message for f in res.failures], [], name)
            self.assertEqual(res.checked, len(tg.load_primitives(path).cases), name)
            rules = {s.rule for s in res.report.values()}
            self.assertEqual(rules, {"bound", "exact"}, f"{name}: every output has a derived rule ({rules})")
        bits = tg.check(GOLDENS[0][1], kernels, bitwise=True)
        self.assertGreater(len(bits.failures), 10)

    def test_selections_exact(self):
        ints = {k: r for k, r in rows().items() if r["integer"]}
        self.assertIn(("router_forward", "sel"), ints)
        self.assertIn(("dsa_select", "sel"), ints)
        for k, r in ints.items():
            self.assertEqual(r["max_err"], 0, f"{k}: {r}")

    def test_floats_within_sanity_scale(self):
        for k, r in rows().items():
            self.assertLessEqual(r["ratio"], torch_report.SANITY, f"{k}: {r}")
        # not vacuous: torch's sums are not the reference's
        self.assertGreater(sum(1 for r in rows().values() if not r["bitwise"]), 30)

    def test_sanity_flags_a_moved_output(self):
        g = tg.load_primitives(GOLDENS[0][1])
        c = g.find("attn_core_forward")
        out = kernels(c.op, c.inputs, c.shapes)
        want = c.outputs["o"]
        self.assertFalse(torch_report.beyond_sanity(out["o"].reshape(want.shape), want)[0])
        moved = out["o"].reshape(want.shape).copy()
        moved.flat[7] += 65 * 2.0 ** -24 * np.abs(want).max()
        self.assertTrue(torch_report.beyond_sanity(moved, want)[0])
        sel = g.find("router_forward").outputs["sel"].copy()
        bad = sel.copy()
        bad[0, 0] += 1
        self.assertTrue(torch_report.beyond_sanity(bad, sel)[0])
        self.assertFalse(torch_report.beyond_sanity(sel, sel)[0])

    def test_report(self):
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = torch_report.main([path for _, path in GOLDENS])
        text = buf.getvalue()
        self.assertEqual(rc, 0, text)
        self.assertIn("attn_core_backward", text)
        self.assertIn("outputs of 38 ops", text)


if __name__ == "__main__":
    unittest.main()
