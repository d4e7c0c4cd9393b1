"""The locks in constraints/: complete pins, one version per package, the hub's the same in both.

``constraints/cpu.txt`` (the CPU install: the Makefile and .ci/run install
with it) and ``constraints/cuda.txt`` (the GPU servers' environment,
environment.yml) are written by constraints/lock.sh.  These checks read the
files only; tests/hub/test_hub_environment.py resolves environment.yml's pip
part against PyPI.
"""
from __future__ import annotations

import re
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;#]*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(name: str) -> dict[str, str]:
    """{package: version} of constraints/NAME; every line that is not a comment must be one exact pin."""
    pins, bad = {}, []
    for line in (REPO / "constraints" / name).read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        found = PIN.match(text)
        if not found:
            bad.append(line)
            continue
        pins[canonical(found.group(1))] = found.group(2)
    assert not bad, f"constraints/{name}: lines that are not one exact pin (name==version): {bad}"
    return pins


def environment_pip_part() -> list[str]:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_locks_pin_everything_once():
    cpu, cuda = read_lock("cpu.txt"), read_lock("cuda.txt")
    assert len(cpu) > 150 and len(cuda) > 150, (len(cpu), len(cuda))
    assert cpu["torch"] == cuda["torch"] == "2.13.0"
    # the CUDA lock is torch's CUDA 13.0 build with its NCCL; the CPU lock holds no NVIDIA wheel
    assert cuda["nvidia-nccl-cu13"] and cuda["cuda-toolkit"].startswith("13.0."), cuda
    assert not [p for p in cpu if p.startswith(("nvidia-", "cuda-", "triton"))], cpu
    differ = {p: (cpu[p], cuda[p]) for p in set(cpu) & set(cuda) if cpu[p] != cuda[p]}
    assert not differ, f"a package the two locks share at two versions (CPU, CUDA): {differ}"


def test_hub_pins_are_the_locks():
    """The hub extra pins exactly what both locks hold: the versions the hub tier ran with."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["hub"]
    pins = dict(PIN.match(spec).groups() for spec in extra)
    assert set(map(canonical, pins)) == {"jupyterhub", "jupyterhub-idle-culler"}, extra
    for lock in (read_lock("cpu.txt"), read_lock("cuda.txt")):
        assert {canonical(k): v for k, v in pins.items()} == {k: lock[k] for k in map(canonical, pins)}


def test_environment_yml_is_built_on_the_cuda_lock():
    part = environment_pip_part()
    assert part[0] == "-c constraints/cuda.txt", part
    lock = read_lock("cuda.txt")
    for spec in part[1:]:
        name = re.split(r"[=<>\[ ]", spec, maxsplit=1)[0]
        assert name == "." or canonical(name) in lock, f"environment.yml names {spec!r}, which the lock lacks"


def test_this_environment_is_the_cpu_lock():
    """Every package of the CPU lock installed here has the lock's version (CI installs with the lock)."""
    lock = read_lock("cpu.txt")
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})  # not setuptools' _vendor
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=site)}
    differ = {p: (v, installed[p]) for p, v in lock.items()
              if p in installed and installed[p].split("+")[0] != v}
    assert not differ, (f"installed versions differ from constraints/cpu.txt (lock, installed): {differ}; "
                        "reinstall with make setup, or rewrite the lock with constraints/lock.sh")
    assert {"torch", "nbgrader", "jupyterlab", "transformers"} <= set(installed) & set(lock)
