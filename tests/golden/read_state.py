#!/usr/bin/env python3
"""Reads a Trident state dump with h5py exactly as docs/golden.md describes (the runnable version of its example).

    read_state.py STATE.h5               any dump (e.g. `trident train --dump`, `trident golden`): verifies the
                                         checksum, the schema and the AdamW moments when present, prints a summary
    read_state.py --test-file STATE.h5   also checks the values tests/golden/test_state_dump.cpp
                                         (PythonH5pyReadsTheFile) wrote, recomputed from the same formulas
Exit 0 on success."""
import json
import sys
import zlib

import h5py
import numpy as np


def load(ds):
    """A dataset as a numpy array of its logical dtype (bf16 -> float32, exactly)."""
    a = ds[()]
    if ds.attrs["dtype"] == "bf16":
        a = (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a)


def verify_checksum(path):
    """docs/golden.md "Checksum": True when the header is there and matches, False for files without one."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(b"\x89HDF\r\n\x1a\n"):
        return False  # no header (older files)
    header = data[:512].split(b"\0", 1)[0].decode("ascii")
    lines = header.splitlines()
    assert lines[0] == "TRIDENT-STATE-CHECKSUM 1", lines
    fields = dict(line.split(" ", 1) for line in lines[1:])
    assert fields["algorithm"] == "crc32" and int(fields["payload_offset"]) == 512, fields
    payload = data[512:]
    assert len(payload) == int(fields["payload_bytes"]), "truncated or extended"
    assert zlib.crc32(payload) == int(fields["crc32"], 16), "checksum mismatch: the file is corrupt"
    return True


GROUPS = ("weights", "grads", "weights_after")
MOMENTS = ("adam_m", "adam_v", "adam_m_after", "adam_v_after")


def read(path):
    """The whole dump as a dict (the docs' example), with the schema checks of docs/golden.md."""
    sealed = verify_checksum(path)
    with h5py.File(path, "r") as f:
        assert int(f.attrs["schema_version"]) == 1, f.attrs["schema_version"]
        d = {
            "sealed": sealed,
            "config": json.loads(f.attrs["config"]),
            "optimizer": json.loads(f.attrs["optimizer"]),
            "seed": int(f.attrs["seed"]),
            "repro": f.attrs["repro"],
            "step": int(f.attrs["step"]) if "step" in f.attrs else 0,
            "tokens": f["inputs/tokens"][()],
            "targets": f["inputs/targets"][()],
            "loss": float(f["loss"][()]),
        }
        assert d["tokens"].dtype == np.int32 and d["tokens"].shape == d["targets"].shape
        present = [g for g in MOMENTS if g in f]
        assert present in ([], list(MOMENTS)), f"AdamW moments: all four groups or none, got {present}"
        for g in GROUPS + tuple(present):
            d[g] = {k: load(v) for k, v in f[g].items()}   # creation (parameter) order
            raw = {k: v.attrs["dtype"] for k, v in f[g].items()}
            d[g + ".dtype"] = raw
        for g in GROUPS[1:] + tuple(present):
            assert list(d[g]) == list(d["weights"]), f"/{g} lists other names than /weights"
            for k in d[g]:
                assert d[g][k].shape == d["weights"][k].shape, f"/{g}/{k} shape"
                assert d[g + ".dtype"][k] == d["weights.dtype"][k], f"/{g}/{k} dtype"
        if present:
            assert d["step"] >= 1, "a dump with moments has a step attribute >= 1"
    return d


def check_test_file(d):
    """The values written by test_state_dump.cpp's PythonH5pyReadsTheFile."""
    assert d["config"] == {"policy": "bf16", "vocab": 16}, d["config"]
    assert d["optimizer"] == {"lr": 0.001}, d["optimizer"]
    assert d["seed"] == 20261129
    assert d["repro"] == "trident train --preset tiny"
    assert (d["tokens"].ravel() == np.arange(6)).all() and d["tokens"].shape == (2, 3)
    want_t = np.arange(6) + 1
    want_t[2] = -100
    assert (d["targets"].ravel() == want_t).all()
    assert d["loss"] == 0.5
    w = 0.25 * np.arange(12, dtype=np.float32) - 1.0
    dd = 1.0 / (np.arange(6) + 1.0)
    for g in GROUPS:
        assert list(d[g]) == ["layers.0.attn.wq", "final_norm", "lm_head"], list(d[g])
        assert d[g + ".dtype"] == {"layers.0.attn.wq": "bf16", "final_norm": "f64", "lm_head": "f32"}
        assert (d[g]["layers.0.attn.wq"] == w.reshape(3, 4)).all()
        assert (d[g]["final_norm"] == dd).all()
        assert (d[g]["lm_head"] == w.reshape(4, 3)).all()


def main(argv):
    test_file = "--test-file" in argv
    paths = [a for a in argv if a != "--test-file"]
    if len(paths) != 1:
        print("usage: read_state.py [--test-file] STATE.h5", file=sys.stderr)
        return 2
    d = read(paths[0])
    if test_file:
        assert d["sealed"], "write_state writes the checksum header"
        check_test_file(d)
    else:
        cfg = d["config"]
        n = sum(v.size for v in d["weights"].values())
        print(f"{d['repro']}\n  seed {d['seed']}, policy {cfg.get('policy')}, step {d['step'] or '(not stored)'}, "
              f"checksum {'ok' if d['sealed'] else 'absent'}, loss {d['loss']:.6f}, {len(d['weights'])} tensors "
              f"({n} values), AdamW moments {'stored' if 'adam_m' in d else 'not stored'}")
        for name, g in list(d["grads"].items())[:3]:
            print(f"  {name:36s} shape {tuple(g.shape)}  |grad|_max {np.max(np.abs(g)):.3e}")
    print("h5py read OK:", paths[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
