"""Tests of the trident_golden package (ctest label `python`): argv[1] is a primitive golden directory.

A numpy re-implementation of two primitives (mm under the stored gemm bound, residual_forward bitwise) passes; the
same with one element one ulp beyond the bound fails with a repro line; one at the last float inside the bound
passes; the command line gives exit codes 0 / 1 / 2."""
import os
import subprocess
import sys
import unittest

import numpy as np

import numpy_kernels
import trident_golden as tg

GOLDEN = None


class TridentGolden(unittest.TestCase):
    def test_reader(self):
        g = tg.load_primitives(GOLDEN)
        ops = {c.op for c in g.cases}
        self.assertGreaterEqual(len(ops), 33, sorted(ops))   # every op of the kernel set
        mm = g.find("mm")
        self.assertIn("C", mm.sum_abs)
        self.assertEqual(mm.sum_abs["C"].shape, mm.outputs["C"].shape)
        self.assertTrue((mm.bound("C") >= 0).all())
        self.assertIn(0, g.comm)

    def test_numpy_passes(self):
        res = tg.check(GOLDEN, numpy_kernels.kernels)
        self.assertEqual(res.failures, [])
        self.assertGreaterEqual(res.checked, 2)   # mm and residual_forward
        self.assertTrue(res.ok)

    def test_numpy_mm_is_not_bitwise(self):
        # The bound matters: numpy's float64-then-round GEMM differs from the in-order fp32 sum somewhere
        # (else this test would prove nothing about the bound).
        g = tg.load_primitives(GOLDEN)
        diff = 0
        for c in g.cases:
            if c.op == "mm":
                diff += int((numpy_kernels.kernels("mm", c.inputs, c.shapes)["C"] != c.outputs["C"]).sum())
        self.assertGreater(diff, 0)

    def test_one_ulp_beyond_the_bound_fails(self):
        res = tg.check(GOLDEN, numpy_kernels.perturbed, impl_name="numpy_kernels:perturbed")
        self.assertEqual(len(res.failures), sum(1 for c in tg.load_primitives(GOLDEN).cases if c.op == "mm"))
        f = res.failures[0]
        self.assertEqual((f.op, f.output), ("mm", "C"))
        self.assertGreater(abs(f.got - f.want), f.bound)
        self.assertIn("--op mm --case c0", f.repro)

    def test_at_the_bound_passes(self):
        res = tg.check(GOLDEN, numpy_kernels.at_bound)
        self.assertEqual(res.failures, [])

    def cli(self, impl):
        env = dict(os.environ)
        return subprocess.run([sys.executable, "-m", "trident_golden", "check", GOLDEN, "--impl", impl],
                              capture_output=True, text=True, env=env)

    def test_cli(self):
        ok = self.cli("numpy_kernels:kernels")
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        bad = self.cli("numpy_kernels:perturbed")
        self.assertEqual(bad.returncode, 1, bad.stdout + bad.stderr)
        self.assertIn("FAIL mm/c0", bad.stdout)
        self.assertIn("repro: python -m trident_golden check", bad.stdout)
        missing = self.cli("numpy_kernels:nope")
        self.assertEqual(missing.returncode, 2)
        self.assertEqual(len(missing.stderr.strip().splitlines()), 1, missing.stderr)


if __name__ == "__main__":
    GOLDEN = sys.argv.pop(1)
    os.environ["TRIDENT_GOLDEN"] = GOLDEN
    unittest.main()
