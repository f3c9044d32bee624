"""Install test of the trident_golden package (ctest label `python`), offline, as docs/golden.md "Python package"
documents it:

    python3 -m venv --system-site-packages VENV
    VENV/bin/pip install --no-build-isolation --no-deps ./python

then `trident-golden --help` and `trident-golden check` on a checked-in golden run from the venv (no PYTHONPATH),
and the source tree is as clean as before (no build/ or *.egg-info in python/, `git status --porcelain python/`
unchanged). pip runs with PIP_NO_INDEX=1: a step that would need the network fails at once instead of waiting.

Usage: test_install.py REPO_ROOT WORK_DIR   (run with the python3 that has h5py and numpy; WORK_DIR gets the venv)
"""
import os
import shutil
import subprocess
import sys


def fail(msg):
    print(f"test_install: FAIL: {msg}")
    sys.exit(1)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r.returncode, r.stdout + r.stderr


def tree_state(root):
    """`git status --porcelain python/` and the build leftovers setuptools would write there."""
    rc, st = run(["git", "-C", root, "status", "--porcelain", "--", "python/"])
    leftovers = sorted(os.path.relpath(os.path.join(d, n), root)
                       for d, dirs, _ in os.walk(os.path.join(root, "python"))
                       for n in dirs if n in ("build", "dist") or n.endswith(".egg-info"))
    return (st if rc == 0 else None), leftovers


def main():
    root, work = (os.path.abspath(a) for a in sys.argv[1:3])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    before = tree_state(root)
    if before[0] is None:
        print("test_install: note: not a git checkout, `git status` is not compared")
    venv = os.path.join(work, "install_venv")
    shutil.rmtree(venv, ignore_errors=True)
    rc, out = run([sys.executable, "-m", "venv", "--system-site-packages", venv], env=env)
    if rc != 0:
        fail(f"`{sys.executable} -m venv` failed (no venv/ensurepip: scripts/deps installs python3-venv):\n{out}")
    py, pip, cmd = (os.path.join(venv, "bin", n) for n in ("python", "pip", "trident-golden"))
    rc, out = run([py, "-c", "import setuptools, wheel, h5py, numpy"], env=env)
    if rc != 0:
        fail(f"{sys.executable} lacks a package the offline install needs (scripts/deps installs python3-setuptools "
             f"python3-wheel python3-h5py python3-numpy):\n{out}")
    rc, out = run([pip, "install", "--no-build-isolation", "--no-deps", "./python"], cwd=root, env=env)
    if rc != 0:
        fail(f"pip install --no-build-isolation --no-deps ./python failed:\n{out}")
    rc, out = run([py, "-c", "import trident_golden; print(trident_golden.__file__)"], cwd=work, env=env)
    if rc != 0 or not os.path.realpath(out.strip()).startswith(os.path.realpath(venv)):
        fail(f"trident_golden is not imported from the venv: {out}")
    rc, out = run([cmd, "--help"], env=env)
    if rc != 0 or "usage: trident-golden" not in out or "check" not in out:
        fail(f"trident-golden --help (exit {rc}):\n{out}")
    # --impl's module is imported from the current directory (tests/python/numpy_kernels.py), as documented
    golden = os.path.join(root, "golden", "data", "primitives", "tiny")
    rc, out = run([cmd, "check", golden, "--impl", "numpy_kernels:kernels"], cwd=os.path.join(root, "tests", "python"),
                  env=env)
    if rc != 0 or "cases passed" not in out:
        fail(f"trident-golden check (exit {rc}):\n{out}")
    print(out.strip())
    rc, out = run([cmd, "check", golden, "--impl", "numpy_kernels:kernels", "--op", "nope"],
                  cwd=os.path.join(root, "tests", "python"), env=env)
    if rc != 2 or "(ops: adamw_step" not in out:
        fail(f"trident-golden check --op nope: expected exit 2 and the list of ops (exit {rc}):\n{out}")
    after = tree_state(root)
    new = [p for p in after[1] if p not in before[1]]
    if new:
        fail(f"the install wrote build output into the source tree: {', '.join(new)}")
    if before[0] is not None and after[0] != before[0]:
        fail(f"`git status --porcelain python/` changed:\nbefore:\n{before[0]}after:\n{after[0]}")
    print("test_install: offline install, trident-golden --help and check OK; python/ unchanged")


if __name__ == "__main__":
    main()
