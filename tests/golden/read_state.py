#!/usr/bin/env python3
"""Reads a Trident state dump with h5py exactly as docs/golden.md describes, and checks the values written by
tests/golden/test_state_dump.cpp (PythonH5pyReadsTheFile) from the same formulas. Exit 0 on success."""
import json
import sys
import zlib

import h5py
import numpy as np


def as_array(ds):
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


def main(path):
    assert verify_checksum(path), "write_state writes the checksum header"
    with h5py.File(path, "r") as f:
        assert int(f.attrs["schema_version"]) == 1, f.attrs["schema_version"]
        assert f.attrs["generator"].startswith("trident "), f.attrs["generator"]
        config = json.loads(f.attrs["config"])
        optimizer = json.loads(f.attrs["optimizer"])
        assert config == {"policy": "bf16", "vocab": 16}, config
        assert optimizer == {"lr": 0.001}, optimizer
        assert int(f.attrs["seed"]) == 20261129
        assert f.attrs["repro"] == "trident train --preset tiny"

        tokens, targets = f["inputs/tokens"][()], f["inputs/targets"][()]
        assert tokens.dtype == np.int32 and tokens.shape == (2, 3)
        assert (tokens.ravel() == np.arange(6)).all(), tokens
        want_t = np.arange(6) + 1
        want_t[2] = -100
        assert (targets.ravel() == want_t).all(), targets

        loss = f["loss"][()]
        assert f["loss"].attrs["dtype"] == "f32" and f["loss"].dtype == np.float32 and float(loss) == 0.5

        w = 0.25 * np.arange(12, dtype=np.float32) - 1.0
        d = 1.0 / (np.arange(6) + 1.0)
        for group in ("weights", "grads", "weights_after"):
            g = f[group]
            names = list(g.keys())  # creation order
            assert names == ["layers.0.attn.wq", "final_norm", "lm_head"], names
            wq = g["layers.0.attn.wq"]
            assert wq.attrs["dtype"] == "bf16" and wq.dtype == np.uint16 and wq.shape == (3, 4)
            assert (as_array(wq) == w.reshape(3, 4)).all()
            fn = g["final_norm"]
            assert fn.attrs["dtype"] == "f64" and fn.dtype == np.float64
            assert (as_array(fn) == d).all()
            lm = g["lm_head"]
            assert lm.attrs["dtype"] == "f32" and lm.dtype == np.float32 and lm.shape == (4, 3)
            assert (as_array(lm) == w.reshape(4, 3)).all()
    print("h5py read OK:", path)


if __name__ == "__main__":
    main(sys.argv[1])
