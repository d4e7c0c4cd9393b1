"""No private name crosses a file in parlab, and every lab's grading package has one shape.

A name that starts with one underscore is private to the module that defines it.  Another module
of the package may neither import it (``from .harness import _judge``) nor reach it through a
module it imported (``trace._storage_bytes``): what two files share is public.  Dunder names
(``__all__``, ``__file__``) and ``sys._getframe``-style access to modules outside parlab are not
counted.

Each lab's grading package (``parlab.grading.labNN``) is in lab 07's shape: an ``__init__`` that
only declares what the lab exports, in under 60 lines, the exercises in modules of their own.
"""
from __future__ import annotations

import ast
import os

import pytest

import parlab

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(parlab.__file__)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` written in ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def package_files() -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(ROOT) for f in files if f.endswith(".py"))


def crossings(path: str) -> list[str]:
    """Every private name of another parlab module that the file at ``path`` uses."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    me = module_name(path)
    is_package = path.endswith("__init__.py")
    modules: dict[str, str] = {}  # local name -> the parlab module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve(me, is_package, node.level, node.module)
            if not source.startswith("parlab"):
                continue
            for alias in node.names:
                if private(alias.name) and source != me:
                    found.append(f"line {node.lineno}: from {source} import {alias.name}")
                modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("parlab"):
                    modules[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "parlab"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules and modules[node.value.id] != me):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({modules[node.value.id]})")
    return found


def test_the_reader_finds_a_crossing(tmp_path):
    """The check can fail: a module importing another's private name, and one reaching into it."""
    pkg = os.path.join(ROOT, "grading")
    fake = os.path.join(pkg, "_crossing_probe.py")
    src = "from .harness import _nothing\nfrom .. import trace\ntrace._storage_bytes\n"
    with open(fake, "w") as f:
        f.write(src)
    try:
        got = crossings(fake)
    finally:
        os.remove(fake)
    assert got == ["line 1: from parlab.grading.harness import _nothing",
                   "line 3: trace._storage_bytes (parlab.trace)"], got


def test_no_private_name_crosses_a_file():
    bad = {os.path.relpath(p, ROOT): c for p in package_files() if (c := crossings(p))}
    assert not bad, "private names used outside their module (make them public or keep them home):\n" + \
        "\n".join(f"  {f}: {', '.join(c)}" for f, c in bad.items())


LABS = sorted(d for d in os.listdir(os.path.join(ROOT, "grading")) if d.startswith("lab"))


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_package_is_in_lab07s_shape(lab):
    folder = os.path.join(ROOT, "grading", lab)
    with open(os.path.join(folder, "__init__.py")) as f:
        text = f.read()
    lines = text.count("\n")
    tree = ast.parse(text)
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    modules = [f for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py"]
    assert lines < 60, f"{lab}/__init__.py has {lines} lines: it should only declare what the lab exports"
    assert not defined, f"{lab}/__init__.py defines {defined}: they belong in the exercise modules"
    assert modules, f"{lab} has no exercise modules"
