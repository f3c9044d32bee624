"""trident-golden check GOLDEN --impl module:function [--op OP] [--case C] [--rank R] [--bitwise] [--report r.json]
(or python -m trident_golden ...; `trident-golden` is the console command an install of ./python adds).

The module of --impl is imported from the current directory or PYTHONPATH. Every output the implementation returns is
judged by the golden's acceptance rule (docs/golden.md "The acceptance rule"), or bit for bit with --bitwise; a table
per (op, output) follows (rule, cases, worst error / bound, worst relative-test ratio, PASS or FAIL).

Exit 0 when every checked case passes, 1 when one fails (one line and a repro line per failure), 2 on bad usage or
input (one 'trident_golden: error: ...' line)."""
import argparse
import importlib
import json
import os
import sys
import tempfile

from .check import check


def load_impl(spec):
    if ":" not in spec:
        raise ValueError(f"--impl '{spec}': expected module:function")
    mod, fn = spec.split(":", 1)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())   # as `python -m` does; the console command's sys.path[0] is its bin folder
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"--impl '{spec}': cannot import module '{mod}': {e}") from None
    f = getattr(m, fn, None)
    if not callable(f):
        raise ValueError(f"--impl '{spec}': module '{mod}' has no function '{fn}'")
    return f


def main(argv=None):
    prog = "trident-golden" if os.path.basename(sys.argv[0] or "") == "trident-golden" else "python -m trident_golden"
    p = argparse.ArgumentParser(prog=prog, description="Check a kernel implementation against Trident's primitive "
                                "goldens (docs/golden.md \"Python package\").")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check an implementation against a primitive golden")
    c.add_argument("golden", help="golden directory or primitives.h5")
    c.add_argument("--impl", required=True, help="module:function, called as f(op, inputs, shapes); the module is "
                   "imported from the current directory or PYTHONPATH")
    c.add_argument("--op")
    c.add_argument("--case")
    c.add_argument("--rank", type=int)
    c.add_argument("--bitwise", action="store_true", help="compare every output bit for bit (the reference's own "
                   "contract) instead of by the golden's acceptance rule")
    c.add_argument("--report", help="write a JSON report here")
    a = p.parse_args(argv)
    try:
        impl = load_impl(a.impl)
        res = check(a.golden, impl, op=a.op, case=a.case, rank=a.rank, impl_name=a.impl, bitwise=a.bitwise)
    except (ValueError, OSError, KeyError) as e:
        print(f"trident_golden: error: {e}", file=sys.stderr)
        return 2
    if res.checked == 0:
        print(f"trident_golden: error: {a.impl} implements none of the {res.skipped} matching cases of {a.golden} "
              f"(it returned None for each)", file=sys.stderr)
        return 2
    if not getattr(res, "sealed", True):
        print(f"note: {a.golden} has no checksum and no case manifest (written before they existed): a flipped data "
              f"bit or a deleted case goes unnoticed")
    print(res.report_text())
    for f in res.failures:
        print(f"FAIL {f.message}")
        print(f"  repro: {f.repro}")
    print(f"trident_golden check {a.golden} --impl {a.impl}: {res.passed}/{res.checked} cases passed, "
          f"{res.skipped} skipped (not implemented); judged by {'bits' if a.bitwise else 'the acceptance rule'}")
    if a.report:
        _write_atomic(a.report, json.dumps({"checked": res.checked, "passed": res.passed, "skipped": res.skipped,
                                            "failures": [f.__dict__ for f in res.failures],
                                            "per_output": res.report_json()}, indent=2) + "\n")
    return 0 if res.ok else 1


def _write_atomic(path, text):
    """Writes through a private folder next to the target and a rename, as Trident's own writers do
    (docs/security.md section 1): a link planted at the target or beside it is replaced, never followed."""
    parent = os.path.dirname(os.path.abspath(path))
    tmpdir = tempfile.mkdtemp(prefix="." + os.path.basename(path) + ".", dir=parent)
    staged = os.path.join(tmpdir, os.path.basename(path))
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(staged, path)
    finally:
        if os.path.exists(staged):
            os.unlink(staged)
        os.rmdir(tmpdir)


if __name__ == "__main__":
    sys.exit(main())
