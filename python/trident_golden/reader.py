"""Readers for the two golden files of docs/golden.md: the state dump (state.h5) and the primitive goldens
(primitives.h5). h5py and numpy only."""
import json
import os
import zlib
from dataclasses import dataclass, field

import h5py
import numpy as np

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def bf16_to_f32(a):
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_array(ds):
    """A dataset as a numpy array of its logical dtype (bf16 -> float32, exactly)."""
    a = ds[()]
    if ds.attrs.get("dtype") == "bf16":
        a = bf16_to_f32(a)
    return np.asarray(a)


def verify_checksum(path):
    """docs/golden.md "Checksum": True when the 512-byte header is there and matches, False for a file without one
    (it starts with the HDF5 signature). Raises ValueError for a corrupt, truncated or extended file."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(HDF5_SIGNATURE):
        return False
    lines = data[:512].split(b"\0", 1)[0].decode("ascii", "replace").splitlines()
    if not lines or lines[0] != "TRIDENT-STATE-CHECKSUM 1":
        raise ValueError(f"{path}: not a state dump (no HDF5 signature, no checksum header)")
    fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    payload = data[512:]
    if len(payload) != int(fields.get("payload_bytes", -1)):
        raise ValueError(f"{path}: truncated or extended: {len(payload)} payload bytes, the header says "
                         f"{fields.get('payload_bytes')}")
    if zlib.crc32(payload) != int(fields.get("crc32", "0"), 16):
        raise ValueError(f"{path}: checksum mismatch: the file is corrupt")
    return True


def load_state(path):
    """A state dump as a dict: config, optimizer, seed, repro, step (0 when absent), tokens, targets, loss, and the
    groups weights, grads, weights_after (and adam_m, adam_v, adam_m_after, adam_v_after when stored), each a dict
    name -> array in parameter order."""
    verify_checksum(path)
    with h5py.File(path, "r") as f:
        if int(f.attrs["schema_version"]) != 1:
            raise ValueError(f"{path}: schema_version {f.attrs['schema_version']} is not 1")
        out = {
            "config": json.loads(f.attrs["config"]),
            "optimizer": json.loads(f.attrs["optimizer"]),
            "seed": int(f.attrs["seed"]),
            "repro": f.attrs["repro"],
            "step": int(f.attrs["step"]) if "step" in f.attrs else 0,
            "tokens": f["inputs/tokens"][()],
            "targets": f["inputs/targets"][()],
            "loss": float(f["loss"][()]),
        }
        for g in ("weights", "grads", "weights_after", "adam_m", "adam_v", "adam_m_after", "adam_v_after"):
            if g in f:
                out[g] = {k: as_array(v) for k, v in f[g].items()}
    return out


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass
class Case:
    """One captured call of one op (docs/golden.md "Primitive goldens")."""
    op: str
    name: str
    rank: int
    dtype: str            # "f32" or "f64": the kernel set's element type
    policy: str           # "fp32", "bf16", "fp64", or "" for ops without a precision policy
    shapes: dict          # the scalar arguments (and "config" for attention ops)
    inputs: dict          # name -> numpy array, in argument order
    outputs: dict         # name -> numpy array (the reference's bits)
    sum_abs: dict         # output name -> sum |terms| per element (only for outputs with an error bound)
    n_terms: dict         # output name -> n_terms
    tolerance: dict       # output name -> {primitive, dtype, direction, k_const, k_per_term, u}
    repro: str

    def bound(self, output):
        """The elementwise error bound (k_const + k_per_term * n_terms) * u * sum_abs, or None (bitwise)."""
        if output not in self.sum_abs:
            return None
        t = self.tolerance[output]
        k = t["k_const"] + t["k_per_term"] * self.n_terms[output]
        return k * t["u"] * self.sum_abs[output].astype(np.float64)


@dataclass
class Primitives:
    path: str
    config: dict
    mesh: dict
    ranks: int
    repro: str
    cases: list = field(default_factory=list)
    comm: dict = field(default_factory=dict)   # rank -> list of {op, comm, seq, count, dtype, peer, recv_hash}

    def find(self, op, name=None, rank=0):
        for c in self.cases:
            if c.op == op and c.rank == rank and (name is None or c.name == name):
                return c
        raise KeyError(f"{self.path}: no case {op}/{name or '*'} on rank {rank}")


def primitives_path(path):
    return os.path.join(path, "primitives.h5") if os.path.isdir(path) else path


def _read_cases(group, rank, out):
    if "primitives" not in group:
        return
    for op, opg in group["primitives"].items():
        for name, g in opg.items():
            a = g.attrs
            out.append(Case(
                op=op, name=name, rank=rank, dtype=_s(a["dtype"]), policy=_s(a["policy"]),
                shapes=json.loads(a["shapes"]),
                inputs={k: v[()] for k, v in g["inputs"].items()},
                outputs={k: v[()] for k, v in g["outputs"].items()},
                sum_abs={k: v[()] for k, v in g["sum_abs"].items()},
                n_terms=json.loads(a["n_terms"]), tolerance=json.loads(a["tolerance"]), repro=_s(a["repro"])))


def load_primitives(path):
    """A primitives.h5 (or a directory holding one) as a Primitives object."""
    p = primitives_path(path)
    with h5py.File(p, "r") as f:
        if _s(f.attrs.get("schema", "")) != "trident-primitives":
            raise ValueError(f"{p}: not a Trident primitives file (attribute 'schema')")
        if int(f.attrs["schema_version"]) != 1:
            raise ValueError(f"{p}: schema_version {f.attrs['schema_version']} is not 1")
        g = Primitives(path=p, config=json.loads(f.attrs["config"]), mesh=json.loads(f.attrs["mesh"]),
                       ranks=int(f.attrs["ranks"]), repro=_s(f.attrs["repro"]))
        _read_cases(f, 0, g.cases)
        for r, rg in f.get("ranks", {}).items():
            if int(r) > 0:
                _read_cases(rg, int(r), g.cases)
            if "comm" in rg:
                c = {k: v[()] for k, v in rg["comm"].items()}   # whole columns (one read each)
                g.comm[int(r)] = [{"op": _s(c["op"][i]), "comm": _s(c["comm"][i]), "seq": int(c["seq"][i]),
                                   "count": int(c["count"][i]), "dtype": _s(c["dtype"][i]),
                                   "peer": int(c["peer"][i]), "recv_hash": int(c["recv_hash"][i])}
                                  for i in range(len(c["seq"]))]
    return g
