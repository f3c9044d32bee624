"""Trident goldens from Python (docs/golden.md): read state dumps and per-primitive goldens, and check a kernel
implementation against them.

    import trident_golden as tg
    g = tg.load_primitives("golden/data/primitives/tiny")
    print(g)                   # a summary: ops and their case counts (never array contents)
    for case in g.cases:
        print(repr(case))      # op/name, rank, input and output names with dtypes and shapes
    g.find("mm", "c0")         # an unknown op, case or rank raises NotFound (a KeyError) listing what exists

    trident-golden check golden/data/primitives/tiny --impl mykernels:kernels    (or python -m trident_golden)
"""
from .reader import (Case, NotFound, Primitives, State, Tensors, bf16_to_f32, load_primitives, load_state,
                     verify_checksum)
from .check import Failure, OutputStat, Result, Verdict, check, judge

__all__ = ["Case", "NotFound", "Primitives", "State", "Tensors", "bf16_to_f32", "load_primitives", "load_state",
           "verify_checksum", "Failure", "OutputStat", "Result", "Verdict", "check", "judge"]
