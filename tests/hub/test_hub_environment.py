"""environment.yml, the GPU servers' environment, resolves from PyPI to exactly the CUDA lock.

Its pip part (``-c constraints/cuda.txt``, ``torch==2.13.0``, ``nvidia-ml-py``,
``.[hub]``) is resolved, as conda's pip would resolve it in the folder of the
file, for a fresh, empty environment of this Python (``venv --without-pip``)
against PyPI, by uv (``uv pip install --dry-run``): uv reads each wheel's
metadata only, where pip's ``--dry-run`` downloads every wheel it picks, over
2 GB of NVIDIA wheels here.  Every package the resolution picks must be in
constraints/cuda.txt at the lock's version, and torch must be its CUDA build
(NCCL among its requirements).  Skipped, with the reason, when PyPI cannot
be reached.  In the hub tier because environment.yml builds the hub's
servers' environment.
"""
from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hub, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
INDEX = "https://pypi.org/simple"
UV = "uv==0.13.9"  # the uv that wrote the locks (constraints/lock.sh)
sys.path.insert(0, str(REPO / "tests" / "unit"))
from test_locks import canonical, environment_pip_part, read_lock  # noqa: E402


def _pypi_reason() -> str | None:
    try:
        with urllib.request.urlopen(f"{INDEX}/uv/", timeout=15) as reply:
            reply.read(1)
    except OSError as e:
        return f"PyPI ({INDEX}) cannot be reached from here ({e}): environment.yml cannot be resolved"
    return None


def test_environment_yml_resolves_to_the_cuda_lock(tmp_path):
    if reason := _pypi_reason():
        pytest.skip(reason)
    tool = tmp_path / "uv"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tool),
                    "--index-url", INDEX, UV], check=True, timeout=180)
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=60)
    args = []
    for item in environment_pip_part():
        args += item.split(None, 1) if item.startswith("-") else [item]
    done = subprocess.run([str(tool / "bin" / "uv"), "pip", "install", "--dry-run", "--no-config",
                           "--python", str(fresh / "bin" / "python"), "--index-url", INDEX,
                           "--cache-dir", str(tmp_path / "cache"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"environment.yml's pip part does not resolve: {out[-3000:]}"
    picked = {canonical(name): version for name, version in re.findall(r"^ \+ (\S+)==(\S+)", out, re.M)}
    assert re.search(r"^ \+ parlab @ file:", out, re.M), out[-2000:]  # "." itself, the student edition
    lock = read_lock("cuda.txt")
    outside = {p: (v, lock.get(p)) for p, v in picked.items() if lock.get(p) != v}
    assert not outside, f"picked at a version constraints/cuda.txt does not hold (picked, lock): {outside}"
    assert picked["torch"] == "2.13.0" and "nvidia-nccl-cu13" in picked, picked
    assert {"jupyterhub", "jupyterhub-idle-culler", "nbgrader", "nvidia-ml-py"} <= set(picked), sorted(picked)
