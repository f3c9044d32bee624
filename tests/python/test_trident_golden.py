"""Tests of the trident_golden package (ctest label `python`): argv[1] is a primitive golden directory.

A numpy re-implementation of two primitives (mm under the stored gemm bound, residual_forward bitwise) passes; the
same with one element one ulp beyond the bound fails with a repro line; one at the last float inside the bound
passes; the command line gives exit codes 0 / 1 / 2; repr()/str() are short summaries (never array contents);
a failed lookup (op, case, rank, tensor, state key) names what exists."""
import os
import re
import subprocess
import sys
import unittest

import numpy as np

import numpy_kernels
import trident_golden as tg

GOLDEN = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
        case = tg.load_primitives(GOLDEN).find("mm", f.case)
        self.assertGreater(abs(f.got - float(case.oracle["C"].ravel()[f.index])), f.bound)
        self.assertIn("--op mm --case c0", f.repro)

    def test_rule_per_output(self):
        # Every output of every case has a rule; the stored data agree with it (docs/golden.md "The acceptance rule").
        g = tg.load_primitives(GOLDEN)
        rules = {}
        for c in g.cases:
            for name, want in c.outputs.items():
                r = c.rule(name)
                rules.setdefault(r, 0)
                rules[r] += 1
                if r == "bound":
                    self.assertEqual(c.oracle[name].shape, want.shape)
                    self.assertTrue((c.bounds[name] >= 0).all() and np.isfinite(c.bounds[name]).all())
                    # the reference itself passes its own rule
                    v = tg.judge(c, name, want)
                    self.assertTrue(v.ok, f"{c.op}/{c.name} {name}: {v.why}")
                if want.dtype.kind == "i":
                    self.assertEqual(r, "exact", f"{c.op} {name}")
        self.assertGreater(rules.get("bound", 0), 40, rules)
        self.assertGreater(rules.get("exact", 0), 5, rules)

    def test_selection_reports_its_tie_margin(self):
        # The router's selection is exact; the golden stores each row's top-k margin over the scores' bounds, and a
        # differing selection names its row's margin (here far above 1: no correct router selects differently).
        c = tg.load_primitives(GOLDEN).find("router_forward")
        self.assertGreater(c.accept["sel"]["min_margin"], 1.0)
        sel = c.outputs["sel"].copy()
        sel[0, 0] = (sel[0, 0] + 1) % c.shapes["E"]
        v = tg.judge(c, "sel", sel)
        self.assertFalse(v.ok)
        self.assertIn("row 0's top-k margin is", v.why)

    def test_bitwise_option(self):
        # numpy's mm passes the rule and fails bits; the report names the rule per output
        res = tg.check(GOLDEN, numpy_kernels.kernels)
        self.assertEqual(res.report[("mm", "C")].rule, "bound")
        self.assertEqual(res.report[("residual_forward", "out")].rule, "exact")
        self.assertIn("mm", res.report_text())
        bits = tg.check(GOLDEN, numpy_kernels.kernels, bitwise=True)
        self.assertTrue(any(f.op == "mm" for f in bits.failures))
        self.assertIn("--bitwise", bits.failures[0].repro)

    def test_at_the_bound_passes(self):
        # The last float inside the per-element bound passes it. One element at the worst case with every other
        # exact may still fail the relative test (rms error vs fp64 above 4x the reference's + floor): the two tests
        # are separate conditions of the rule, so only the per-element verdict is asserted here.
        g = tg.load_primitives(GOLDEN)
        for c in g.cases:
            if c.op == "mm":
                got = numpy_kernels.at_bound("mm", c.inputs, c.shapes)["C"]
                v = tg.judge(c, "C", got)
                self.assertLessEqual(v.worst_ratio, 1.0, f"{c.name}: {v.why}")
                self.assertGreater(v.worst_ratio, 0.5)

    def test_reprs_are_short(self):
        # repr()/str() of the golden, a case, its tensors and a state dump: a few lines, names with dtypes and
        # shapes, never array contents (numpy's "array(" or "[[", or the long runs of digits of a printed array).
        g = tg.load_primitives(GOLDEN)
        state = tg.load_state(os.path.join(ROOT, "golden", "data", "micro_bf16_step1.h5"))
        objs = [g, g.cases, state, state["weights"]]
        for c in g.cases:
            objs += [c, c.inputs, c.outputs]
        for o in objs:
            for text in (repr(o), str(o)):
                if o is g.cases:
                    self.assertLess(len(text), 300 * len(g.cases))   # one line per case
                    continue
                self.assertLessEqual(len(text.splitlines()), 20, text)
                self.assertLess(len(text), 3000, text)
                self.assertNotIn("array(", text)
                self.assertNotIn("[[", text)
                self.assertIsNone(re.search(r"(\d+\.\d+(e[+-]\d+)?,?\s+){8}", text), text)
        mm = g.find("mm")
        self.assertEqual(len(repr(mm).splitlines()), 1)
        for want in ("mm/c0", "rank 0", "A float32[", "C float32[", "(bound)"):
            self.assertIn(want.replace("float32", "float64" if mm.dtype == "f64" else "float32"), repr(mm))
        self.assertIn("mm (", str(g))
        self.assertIn(f"{len(g.cases)} cases of {len(g.ops)} ops", repr(g))
        self.assertIn("weights (", repr(state))
        # still plain dicts of arrays
        self.assertIsInstance(mm.inputs, dict)
        self.assertIsInstance(mm.inputs["A"], np.ndarray)

    def test_lookups_list_what_exists(self):
        g = tg.load_primitives(GOLDEN)
        with self.assertRaises(KeyError) as e:
            g.find("no_such_op")
        self.assertIn("no op 'no_such_op'", str(e.exception))
        for op in ("mm", "residual_forward", "adamw_step"):
            self.assertIn(op, str(e.exception))
        with self.assertRaises(KeyError) as e:
            g.find("mm", "c99")
        self.assertIn("no case 'c99' of op 'mm'", str(e.exception))
        self.assertIn("(cases: c0", str(e.exception))
        with self.assertRaises(KeyError) as e:
            g.find("mm", rank=99)
        self.assertIn("ranks with mm: 0", str(e.exception))
        mm = g.find("mm")
        with self.assertRaises(KeyError) as e:
            mm.inputs["Z"]
        self.assertIn("mm/c0 inputs: no 'Z' (has: A, B)", str(e.exception))
        with self.assertRaises(KeyError) as e:
            mm.bound("Z")
        self.assertIn("(outputs: C)", str(e.exception))
        state = tg.load_state(os.path.join(ROOT, "golden", "data", "micro_bf16_step1.h5"))
        with self.assertRaises(KeyError) as e:
            state["adam_m"]   # not stored in this dump
        self.assertIn("keys: config, optimizer", str(e.exception))
        with self.assertRaises(KeyError) as e:
            state["weights"]["nope"]
        self.assertIn("weights: no 'nope' (has: embed, ", str(e.exception))
        # a long list is cut: at most 40 names, then how many more
        long = tg.reader.names(range(100))
        self.assertIn("39, ... (60 more)", long)
        # check() with a filter that matches nothing: the same message (the command line: exit 2, one line)
        with self.assertRaises(KeyError) as e:
            tg.check(g, numpy_kernels.kernels, op="mmm")
        self.assertIn("(ops: adamw_step", str(e.exception))
        bad = subprocess.run([sys.executable, "-m", "trident_golden", "check", GOLDEN, "--impl",
                              "numpy_kernels:kernels", "--op", "mm", "--case", "c99"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
        self.assertEqual(bad.stderr.strip().splitlines(),
                         [f"trident_golden: error: {g.path}: no case 'c99' of op 'mm' (cases: c0)"])

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
