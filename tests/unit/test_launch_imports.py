"""parlab.launch's modules import one another without a cycle, so no import order holds them together.

Only imports at module level count: an import inside a function runs after
every module has loaded.  The package's ``__init__`` imports its modules; a
module that imports the package back (``from . import name`` of something
defined in ``__init__``) is a cycle.
"""
import ast
import os

import pytest

import parlab.launch

pytestmark = pytest.mark.unit
FOLDER = os.path.dirname(parlab.launch.__file__)


def module_level_imports(name: str) -> set[str]:
    """The parlab.launch modules that ``name`` ("__init__", "job", ...) imports at load time."""
    with open(os.path.join(FOLDER, f"{name}.py")) as f:
        tree = ast.parse(f.read())
    modules = {n[:-3] for n in os.listdir(FOLDER) if n.endswith(".py")}
    found = set()
    for node in tree.body:  # the module's own statements, not those inside functions
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:  # from . import a, b: modules, or names defined in __init__
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("parlab.launch"):
            rest = node.module[len("parlab.launch"):].lstrip(".")
            found.add(rest.split(".")[0] if rest else "__init__")
    return found - {name}


def test_no_module_of_the_launcher_imports_itself_back():
    modules = sorted(n[:-3] for n in os.listdir(FOLDER) if n.endswith(".py"))
    graph = {m: module_level_imports(m) for m in modules}
    assert "warm" in graph["__init__"] and "errors" in graph["job"], graph  # the graph is read at all

    def cycle_from(start, path):
        for nxt in sorted(graph[path[-1]]):
            if nxt == start:
                return path + [nxt]
            if nxt not in path:
                found = cycle_from(start, path + [nxt])
                if found:
                    return found
        return None

    cycles = [c for m in modules if (c := cycle_from(m, [m]))]
    assert not cycles, f"import cycles: {cycles[:3]}"
