"""numpy re-implementations of two Kernels<T> ops, for tests/python/test_trident_golden.py:

  mm                C (M, ldc) = A (M, lda) @ op(B): computed in float64 and rounded once, so it differs from the
                    reference's in-order fp32 sum by rounding only (within the acceptance rule, not bitwise)
  residual_forward  out = a + b elementwise in the golden's dtype (IEEE: bitwise equal to the reference)

`kernels` is the honest implementation; `perturbed` moves one element of mm's output one ulp beyond the stored
bound around the fp64 oracle (it must fail); `at_bound` moves it to the last float inside the bound (it must pass).
The last two read the golden named by the environment variable TRIDENT_GOLDEN to find the oracle and the bound."""
import os

import numpy as np

import trident_golden as tg


def _mm(inputs, s):
    M, N, K = s["M"], s["N"], s["K"]
    A = inputs["A"].reshape(M, s["lda"])[:, :K].astype(np.float64)
    B = inputs["B"].astype(np.float64)
    B = B.reshape(N, s["ldb"])[:, :K].T if s["trans_b"] else B.reshape(K, s["ldb"])[:, :N]
    C = np.zeros((M, s["ldc"]), dtype=inputs["A"].dtype)
    C[:, :N] = (A @ B).astype(inputs["A"].dtype)
    return {"C": C}


def kernels(op, inputs, shapes):
    if op == "mm":
        return _mm(inputs, shapes)
    if op == "residual_forward":
        return {"out": inputs["a"] + inputs["b"]}
    return None


def _moved(op, inputs, shapes, beyond):
    out = kernels(op, inputs, shapes)
    if op != "mm":
        return out
    g = tg.load_primitives(os.environ["TRIDENT_GOLDEN"])
    case = next(c for c in g.cases if c.op == "mm" and c.rank == 0 and
                all(np.array_equal(c.inputs[k], inputs[k]) for k in inputs))
    want = case.oracle["C"].ravel()
    bound = case.bounds["C"].ravel()
    i = int(np.argmax(bound))               # an element with a non-zero bound
    C = out["C"].ravel()
    t = np.asarray(want[i], dtype=np.float64) + bound[i]
    x = np.float32(t) if C.dtype == np.float32 else np.float64(t)
    # the last float inside the bound, or one ulp beyond it
    while abs(float(x) - float(want[i])) > bound[i]:
        x = np.nextafter(x, -np.inf, dtype=C.dtype)
    while abs(float(np.nextafter(x, np.inf, dtype=C.dtype)) - float(want[i])) <= bound[i]:
        x = np.nextafter(x, np.inf, dtype=C.dtype)
    C[i] = np.nextafter(x, np.inf, dtype=C.dtype) if beyond else x
    return {"C": C.reshape(out["C"].shape)}


def perturbed(op, inputs, shapes):
    return _moved(op, inputs, shapes, True)


def at_bound(op, inputs, shapes):
    return _moved(op, inputs, shapes, False)
