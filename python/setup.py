"""Keeps `pip install ./python` from writing into the source tree: setuptools' build/ and *.egg-info folders go to a
temporary folder, removed when the build step ends (the metadata lives in pyproject.toml)."""
import atexit
import shutil
import tempfile

from setuptools import setup

_tmp = tempfile.mkdtemp(prefix="trident-golden-build.")
atexit.register(shutil.rmtree, _tmp, True)
setup(options={"build": {"build_base": _tmp + "/build"}, "egg_info": {"egg_base": _tmp}})
