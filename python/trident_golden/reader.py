"""Readers for the two golden files of docs/golden.md: the state dump (state.h5) and the primitive goldens
(primitives.h5). h5py and numpy only."""
import json
import os
import textwrap
import zlib
from dataclasses import dataclass, field

import numpy as np

try:
    import h5py
except ImportError as e:   # installed with --no-deps (docs/golden.md "Python package")
    raise ImportError(f"trident_golden needs h5py ({e}): apt-get install python3-h5py, or pip install h5py") from e

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class NotFound(KeyError):
    """A failed lookup (op, case, rank, tensor or group name); the message lists what exists. A KeyError whose
    message prints as written (KeyError's own str() quotes it)."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def names(items, limit=40):
    """'a, b, c' for an error message: at most `limit` names, then how many more; '(none)' when empty."""
    items = [str(x) for x in items]
    if not items:
        return "(none)"
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def describe(a):
    """'float32[32, 64]': dtype and shape of an array, never its contents."""
    if isinstance(a, np.ndarray):
        return f"{a.dtype}[{', '.join(str(n) for n in a.shape)}]"
    return type(a).__name__


class Tensors(dict):
    """name -> numpy array, in argument or parameter order. A plain dict whose repr lists names, dtypes and shapes
    (never the values), and whose failed lookup names what it holds."""

    def __init__(self, items=(), what="tensors"):
        super().__init__(items)
        self.what = what   # for messages: "mm/c0 inputs", "weights"

    def __missing__(self, key):
        raise NotFound(f"{self.what}: no '{key}' (has: {names(self)})")

    def __repr__(self):
        items = [f"{k}: {describe(v)}" for k, v in self.items()]
        if len(items) <= 6:
            return "{" + ", ".join(items) + "}"
        shown = items[:16] + ([f"... ({len(items) - 16} more)"] if len(items) > 16 else [])
        return "{" + ",\n ".join(shown) + "}"


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
    """docs/golden.md "Checksum" (state dumps and primitive goldens share it): True when the 512-byte header is there
    and matches, False for a file without one (it starts with the HDF5 signature: written before the checksum
    existed). Raises ValueError for a corrupt, truncated or extended file."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(HDF5_SIGNATURE):
        return False
    lines = data[:512].split(b"\0", 1)[0].decode("ascii", "replace").splitlines()
    if not lines or lines[0] != "TRIDENT-STATE-CHECKSUM 1":
        raise ValueError(f"{path}: not a Trident golden (no HDF5 signature, no checksum header)")
    fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    try:
        header = ("TRIDENT-STATE-CHECKSUM 1\nalgorithm crc32\npayload_offset 512\n"
                  f"payload_bytes {int(fields['payload_bytes'])}\ncrc32 {int(fields['crc32'], 16):08x}\n")
    except (KeyError, ValueError):
        raise ValueError(f"{path}: the checksum header is corrupt") from None
    if data[:512] != header.encode("ascii").ljust(512, b"\0"):
        raise ValueError(f"{path}: the checksum header is corrupt")
    payload = data[512:]
    if len(payload) != int(fields.get("payload_bytes", -1)):
        raise ValueError(f"{path}: truncated or extended: {len(payload)} payload bytes, the header says "
                         f"{fields.get('payload_bytes')}")
    if zlib.crc32(payload) != int(fields.get("crc32", "0"), 16):
        raise ValueError(f"{path}: checksum mismatch: the file is corrupt")
    return True


STATE_GROUPS = ("weights", "grads", "weights_after", "adam_m", "adam_v", "adam_m_after", "adam_v_after")


class State(dict):
    """A state dump (load_state): a dict whose repr is a summary and whose failed lookup lists the keys."""

    def __init__(self, items=(), path=""):
        super().__init__(items)
        self.path = path

    def __missing__(self, key):
        raise NotFound(f"{self.path or 'state dump'}: no key '{key}' (keys: {names(self)})")

    def __repr__(self):
        groups = ", ".join(f"{g} ({len(self[g])})" for g in STATE_GROUPS if g in self)
        return f"<State {self.path}: step {self.get('step')}, loss {self.get('loss')!r}, " \
               f"tokens {describe(self.get('tokens'))}; groups {groups or '(none)'}>"

    def __str__(self):
        cfg = self.get("config", {})
        lines = [repr(self),
                 "  config: " + names([f"{k}={v}" for k, v in cfg.items() if not isinstance(v, dict)], 12),
                 f"  seed {self.get('seed')}, repro: {self.get('repro', '')}"]
        if "weights" in self:
            lines.append(f"  weights: {names([f'{k} {describe(v)}' for k, v in self['weights'].items()], 8)}")
        return "\n".join(lines)


def load_state(path):
    """A state dump as a State (a dict; .path is the file): config, optimizer, seed, repro, step (0 when absent), tokens,
    targets, loss, and the groups weights, grads, weights_after (and adam_m, adam_v, adam_m_after, adam_v_after
    when stored), each a Tensors (dict name -> array) in parameter order."""
    verify_checksum(path)
    with h5py.File(path, "r") as f:
        if int(f.attrs["schema_version"]) != 1:
            raise ValueError(f"{path}: schema_version {f.attrs['schema_version']} is not 1")
        out = State({
            "config": json.loads(f.attrs["config"]),
            "optimizer": json.loads(f.attrs["optimizer"]),
            "seed": int(f.attrs["seed"]),
            "repro": f.attrs["repro"],
            "step": int(f.attrs["step"]) if "step" in f.attrs else 0,
            "tokens": f["inputs/tokens"][()],
            "targets": f["inputs/targets"][()],
            "loss": float(f["loss"][()]),
        }, path=path)
        for g in STATE_GROUPS:
            if g in f:
                out[g] = Tensors(((k, as_array(v)) for k, v in f[g].items()), what=g)
    return out


def _s(x):
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass(repr=False)
class Case:
    """One captured call of one op (docs/golden.md "Primitive goldens"). repr(): one line; str(): a few lines."""
    op: str
    name: str
    rank: int
    dtype: str            # "f32" or "f64": the kernel set's element type
    policy: str           # "fp32", "bf16", "fp64", or "" for ops without a precision policy
    shapes: dict          # the scalar arguments (and "config" for attention ops)
    inputs: dict          # name -> numpy array, in argument order (a Tensors)
    outputs: dict         # name -> numpy array (the reference's bits)
    sum_abs: dict         # output name -> sum |terms| per element (only for outputs with an error bound)
    n_terms: dict         # output name -> n_terms
    tolerance: dict       # output name -> {primitive, dtype, direction, k_const, k_per_term, u}
    repro: str
    # the derived acceptance rule (docs/golden.md "The acceptance rule"): output name -> {"rule": "bound", "row",
    # "k_rel", "floor"} or {"rule": "exact"}; oracle and bound per element for the outputs with the bound rule
    accept: dict = field(default_factory=dict)
    oracle: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)

    def rule(self, output):
        """The rule `output` is judged by: "bound" (per element against the fp64 oracle, and the relative test),
        "exact" (bits: a correct implementation cannot change them), "sum_abs" (a golden written before the derived
        rule: the stored error bound), or "bitwise" (no rule derived for this output)."""
        if output not in self.outputs:
            raise NotFound(f"{self.op}/{self.name}: no output '{output}' (outputs: {names(self.outputs)})")
        a = self.accept.get(output)
        if a is not None:
            return a["rule"]
        return "sum_abs" if output in self.sum_abs else "bitwise"

    def bound(self, output):
        """The elementwise error bound (k_const + k_per_term * n_terms) * u * sum_abs, or None (bitwise)."""
        if output not in self.outputs:
            raise NotFound(f"{self.op}/{self.name}: no output '{output}' (outputs: {names(self.outputs)})")
        if output not in self.sum_abs:
            return None
        t = self.tolerance[output]
        k = t["k_const"] + t["k_per_term"] * self.n_terms[output]
        return k * t["u"] * self.sum_abs[output].astype(np.float64)

    def _tensors(self, group, limit=None):
        items = [f"{k} {describe(v)}" + (" (bound)" if group is self.outputs and k in self.sum_abs else "")
                 for k, v in group.items()]
        if limit is not None and len(items) > limit:
            items = items[:limit] + [f"+{len(items) - limit} more"]
        return ", ".join(items) or "-"

    def __repr__(self):
        return f"<Case {self.op}/{self.name} rank {self.rank} {self.dtype}" + \
               (f" policy {self.policy}" if self.policy else "") + \
               f": {self._tensors(self.inputs, 3)} -> {self._tensors(self.outputs, 3)}>"

    def __str__(self):
        shapes = " ".join(f"{k}={v}" if not isinstance(v, dict) else f"{k}={{{len(v)} keys}}"
                          for k, v in self.shapes.items())
        return "\n".join([
            f"Case {self.op}/{self.name} (rank {self.rank}, {self.dtype}" +
            (f", policy {self.policy})" if self.policy else ")"),
            f"  inputs:  {self._tensors(self.inputs)}",
            f"  outputs: {self._tensors(self.outputs)}   ((bound): compared under the stored error "
            f"bound; others bit for bit)",
            f"  shapes:  {shapes or '-'}",
            f"  repro:   {self.repro}"])


@dataclass(repr=False)
class Primitives:
    """A primitives.h5 (load_primitives). repr(): one line; str(): a few lines (ops with their case counts)."""
    path: str
    config: dict
    mesh: dict
    ranks: int
    repro: str
    cases: list = field(default_factory=list)
    comm: dict = field(default_factory=dict)   # rank -> list of {op, comm, seq, count, dtype, peer, recv_hash}
    sealed: bool = False   # the file has the checksum header (verified) and the case manifest (checked)

    @property
    def ops(self):
        """The op names that have cases, sorted."""
        return sorted({c.op for c in self.cases})

    def select(self, op=None, name=None, rank=None):
        """The cases matching every filter given (None: any). A filter naming nothing that exists raises NotFound
        listing what does (the ops; the cases of that op; the ranks holding it)."""
        cases = self.cases
        if op is not None:
            cases = [c for c in cases if c.op == op]
            if not cases:
                raise NotFound(f"{self.path}: no op '{op}' (ops: {names(self.ops)})")
        if rank is not None:
            on_rank = [c for c in cases if c.rank == rank]
            if not on_rank:
                what = f"op '{op}'" if op is not None else "no case"
                ranks = sorted({c.rank for c in cases})
                raise NotFound(f"{self.path}: {what} {'has no case ' if op is not None else ''}on rank {rank} "
                               f"(ranks{' with ' + op if op is not None else ''}: {names(ranks)})")
            cases = on_rank
        if name is not None:
            named = [c for c in cases if c.name == name]
            if not named:
                where = (f" of op '{op}'" if op is not None else "") + (f" on rank {rank}" if rank is not None else "")
                listed = sorted({c.name for c in cases})
                raise NotFound(f"{self.path}: no case '{name}'{where} (cases: {names(listed)})")
            cases = named
        return list(cases)

    def find(self, op, name=None, rank=0):
        """The first case of `op` (named `name`, if given) on `rank`; NotFound (a KeyError) listing what exists."""
        return self.select(op, name, rank)[0]

    def __repr__(self):
        return f"<Primitives {self.path}: {len(self.cases)} cases of {len(self.ops)} ops, {self.ranks} " \
               f"rank{'s' if self.ranks != 1 else ''}>"

    def __str__(self):
        counts = {}
        for c in self.cases:
            counts[c.op] = counts.get(c.op, 0) + 1
        ops = textwrap.wrap(", ".join(f"{o} ({n})" for o, n in sorted(counts.items())), 110)
        if len(ops) > 10:
            ops = ops[:10] + ["..."]
        mesh = self.mesh.get("spec", "") if isinstance(self.mesh, dict) else self.mesh
        return "\n".join([repr(self), f"  mesh: {mesh}", f"  repro: {self.repro}", "  ops (cases):"] +
                          ["    " + line for line in ops])


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
                inputs=Tensors(((k, v[()]) for k, v in g["inputs"].items()), what=f"{op}/{name} inputs"),
                outputs=Tensors(((k, v[()]) for k, v in g["outputs"].items()), what=f"{op}/{name} outputs"),
                sum_abs=Tensors(((k, v[()]) for k, v in g["sum_abs"].items()), what=f"{op}/{name} sum_abs (outputs with an error bound)"),
                n_terms=json.loads(a["n_terms"]), tolerance=json.loads(a["tolerance"]), repro=_s(a["repro"]),
                accept=json.loads(a["accept"]) if "accept" in a else {},
                oracle=Tensors(((k, v[()]) for k, v in g["oracle"].items()), what=f"{op}/{name} oracle")
                if "oracle" in g else Tensors((), what=f"{op}/{name} oracle"),
                bounds=Tensors(((k, v[()]) for k, v in g["bound"].items()), what=f"{op}/{name} bound")
                if "bound" in g else Tensors((), what=f"{op}/{name} bound")))


def _check_manifest(p, f, g):
    """The case manifest (root attribute `manifest`, files with a checksum): every case with its input, output and
    sum_abs names per rank, and each rank's trace length; a missing or extra case, tensor or rank is an error."""
    m = json.loads(_s(f.attrs["manifest"]))
    if m.get("ranks") != g.ranks:
        raise ValueError(f"{p}: attribute 'ranks' is {g.ranks}, the manifest says {m.get('ranks')}")
    have = {(c.rank, c.op, c.name): c for c in g.cases}
    for e in m.get("cases", []):
        key = (e["rank"], e["op"], e["case"])
        c = have.pop(key, None)
        if c is None:
            raise ValueError(f"{p}: case {e['op']}/{e['case']} of rank {e['rank']} is missing (the manifest lists it)")
        for part, got in (("inputs", c.inputs), ("outputs", c.outputs), ("sum_abs", c.sum_abs),
                          ("oracle", c.oracle), ("bound", c.bounds)):
            if part in ("oracle", "bound") and not got and part not in e:
                continue
            if list(got) != e.get(part):
                raise ValueError(f"{p}: case {c.op}/{c.name} of rank {c.rank}: its {part} are {list(got)}, "
                                 f"the manifest says {e.get(part)}")
    if have:
        r, op, name = next(iter(have))
        raise ValueError(f"{p}: case {op}/{name} of rank {r} is not in the manifest")
    comm = [len(g.comm.get(r, [])) for r in range(g.ranks)]
    if comm != m.get("comm"):
        raise ValueError(f"{p}: the communication traces have {comm} rows per rank, the manifest says {m.get('comm')}")


def load_primitives(path):
    """A primitives.h5 (or a directory holding one) as a Primitives object. The checksum header is verified before
    h5py reads the file and the case manifest after (files written before both existed load with `.sealed` False)."""
    p = primitives_path(path)
    sealed = verify_checksum(p)
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
        if sorted(int(r) for r in f.get("ranks", {})) != list(range(g.ranks)):
            raise ValueError(f"{p}: attribute 'ranks' is {g.ranks}, the file holds rank groups "
                             f"{sorted(int(r) for r in f.get('ranks', {}))}")
        if "manifest" in f.attrs:
            _check_manifest(p, f, g)
        elif sealed:
            raise ValueError(f"{p}: the root attribute 'manifest' is missing (a file with a checksum always has one)")
    g.sealed = sealed
    return g
