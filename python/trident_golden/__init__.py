"""Trident goldens from Python (docs/golden.md): read state dumps and per-primitive goldens, and check a kernel
implementation against them.

    import trident_golden as tg
    g = tg.load_primitives("golden/data/primitives/tiny")
    for case in g.cases:
        print(case.op, case.name, {k: v.shape for k, v in case.inputs.items()})

    python -m trident_golden check golden/data/primitives/tiny --impl mykernels:run
"""
from .reader import (Case, Primitives, bf16_to_f32, load_primitives, load_state, verify_checksum)
from .check import Failure, Result, check

__all__ = ["Case", "Primitives", "bf16_to_f32", "load_primitives", "load_state", "verify_checksum", "Failure",
           "Result", "check"]
