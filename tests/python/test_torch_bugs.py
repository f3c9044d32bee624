"""The planted bugs of trident_golden.torch_bugs (ctest label `python`): at least 20, each touching ops of the kernel
set, each failing the golden's acceptance rule on at least one checked-in golden (and beyond the sanity scale, or with
a selection that differs), while the honest kernel set passes the rule and the scale on every golden. Skipped (exit 77) where PyTorch is not installed."""
import sys
import unittest

try:
    import torch
except ImportError as e:
    print(f"test_torch_bugs: SKIPPED: PyTorch is not importable ({e}); apt-get install python3-torch")
    sys.exit(77)

import trident_golden as tg
from trident_golden import torch_bugs, torch_report
from trident_golden.torch_ops import TorchKernels, kernels

torch.set_num_threads(1)
GOLDENS = [(n, tg.load_primitives(p)) for n, p in torch_report.default_goldens()]
ROOT = __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "..", "..")


class TorchBugs(unittest.TestCase):
    def test_catalogue(self):
        self.assertGreaterEqual(len(torch_bugs.BUGS), 20)
        self.assertEqual(len({b.name for b in torch_bugs.BUGS}), len(torch_bugs.BUGS))
        for b in torch_bugs.BUGS:
            self.assertTrue(b.ops and set(b.ops) <= set(TorchKernels.OPS), b.name)
            self.assertTrue(b.description, b.name)

    def test_every_bug_detected(self):
        for b in torch_bugs.BUGS:
            out = {n: torch_bugs.outcome(b.impl, g, b.ops) for n, g in GOLDENS}
            self.assertTrue([n for n, o in out.items() if o["sanity"]], f"{b.name}: not detected on any golden")
            self.assertTrue([n for n, o in out.items() if o["checker_failed"]], f"{b.name}: passes the rule everywhere")

    def test_honest_kernels_not_detected(self):
        ops = TorchKernels.OPS
        for n, g in GOLDENS:
            o = torch_bugs.outcome(lambda: kernels, g, ops)
            self.assertFalse(o["sanity"], f"{n}: {o}")
            self.assertFalse(o["checker_failed"], f"{n}: the honest set fails the rule: {o}")
            # and both tolerance checks accept it (their "missed" flag: every output passes)
            self.assertTrue(o["allclose_missed"] and o["assert_close_missed"], f"{n}: {o}")

    def test_bf16_accumulation_fails_the_bf16_goldens(self):
        # The bf16 policy is bf16 operands with fp32 accumulation: a kernel that also accumulates in bf16 (every
        # partial sum of its GEMMs rounded to bfloat16) is wrong, and the rule rejects it on the bf16 golden, while
        # the kernel set that follows the policy passes (test_torch_ops).
        class Bf16Accumulation(TorchKernels):
            def __init__(self):
                super().__init__("bf16")

            def matmul(self, a, b):
                a, b = self.operand(a), self.operand(b)
                if a.shape[-1] == 0:
                    return torch.matmul(a, b)
                acc = None
                for k in range(a.shape[-1]):   # one rank-1 product per k, the running sum rounded to bf16
                    t = a[..., :, k:k + 1] * b[..., k:k + 1, :]
                    acc = t.to(torch.bfloat16) if acc is None else (acc.float() + t).to(torch.bfloat16)
                return acc.float()

        golden = tg.load_primitives(f"{ROOT}/golden/data/primitives/tiny-bf16")
        bad = Bf16Accumulation()
        for op in ("mm", "swiglu_forward", "attn_out_forward"):
            res = tg.check(golden, bad, op=op)
            self.assertTrue(res.failures, f"{op}: bf16 accumulation passes the bf16 rule")
            self.assertIn("bf16", golden.find(op).policy)

    def test_bug_leaves_other_ops_alone(self):
        b = next(b for b in torch_bugs.BUGS if b.name == "gelu_for_silu")
        impl = b.impl()
        c = GOLDENS[0][1].find("residual_forward")
        self.assertTrue((impl(c.op, c.inputs, c.shapes)["out"] == kernels(c.op, c.inputs, c.shapes)["out"]).all())


if __name__ == "__main__":
    unittest.main()
