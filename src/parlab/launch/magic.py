"""``%%torchrun``: run a notebook cell on every rank.

    %load_ext parlab
    %%torchrun -n 4 --timeout 60
    x = torch.ones(2) * rank
    dist.all_reduce(x)
    x            # a final expression becomes the list of per-rank values

The cell sees ``rank``, ``world_size``, ``device``, ``torch``, ``dist`` and the
notebook's own variables that it names (sent by value, like ``launch``).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import re
import shlex
import sys



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%torchrun", add_help=False, exit_on_error=False)
    p.add_argument("-n", "--nproc", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--debug", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_line(line: str) -> dict:
    try:
        opts, rest = _parser().parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as exc:
        raise ValueError(f"%%torchrun: {exc}. Usage: %%torchrun -n 4 [--timeout S] [--backend gloo|nccl] "
                         "[--debug] [--seed N]") from None
    if rest:
        raise ValueError(f"%%torchrun: unknown option(s) {' '.join(rest)}. Usage: %%torchrun -n 4 "
                         "[--timeout S] [--backend gloo|nccl] [--debug] [--seed N]")
    return vars(opts)


def names_used(tree: ast.AST) -> set[str]:
    """Every name the cell reads (we send only those notebook variables)."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


_IPYTHON_HISTORY = re.compile(r"^(_+|_i+|_i\d+|_\d+|_oh|_ih|_dh)$")


_PROVIDED = {"rank", "world_size", "device", "torch", "dist", "parlab", "In", "Out", "exit", "quit",
             "get_ipython"}


def torchrun(line: str, cell: str, ipython=None):
    __tracebackhide__ = True  # IPython hides the magic's own frames
    opts = parse_line(line)
    count = _current_cell_number(ipython)
    filename = f"<torchrun-cell-{count}>"
    # One parse; a SyntaxError here points at the cell's own line.
    tree = compile(cell, filename, "exec", ast.PyCF_ONLY_AST)
    wanted = names_used(tree)
    user_ns = ipython.user_ns if ipython is not None else {}
    names, skipped = {}, []
    from . import pickling, run_cell

    for name in sorted(wanted - _PROVIDED):
        if name not in user_ns or user_ns[name] is getattr(builtins, name, object()):
            continue
        if _IPYTHON_HISTORY.match(name):
            continue  # _, __, _i3, _oh...: IPython's own bookkeeping
        try:
            pickling.dumps(user_ns[name])
        except Exception as exc:  # noqa: BLE001
            skipped.append(f"{name} ({type(exc).__name__})")
            continue
        names[name] = user_ns[name]
    if skipped:
        print("%%torchrun: these notebook variables cannot be sent to the ranks and will be undefined "
              f"there: {', '.join(skipped)}", file=sys.stderr)
    has_value = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
    results = run_cell(cell, names, nproc=opts["nproc"], backend=opts["backend"], timeout=opts["timeout"],
                    debug=opts["debug"] or None, seed=opts["seed"], filename=filename,
                    label=f"Cell In[{count}]" if count is not None else None)
    return results if has_value else None


def _current_cell_number(ipython):
    """The running cell's In[n]: IPython registers each cell's code name as it compiles it."""
    mapping = getattr(getattr(ipython, "compile", None), "_filename_map", None)
    if mapping:
        return max(mapping.values())
    return getattr(ipython, "execution_count", None)


def register(ipython) -> None:
    def magic(line, cell):
        __tracebackhide__ = True
        return torchrun(line, cell, ipython)

    magic.__doc__ = __doc__
    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchrun")
