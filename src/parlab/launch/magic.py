"""``%%torchrun``: run a notebook cell on every rank.

    %load_ext parlab
    %%torchrun -n 4 --timeout 60
    x = torch.ones(2) * rank
    dist.all_reduce(x)
    x            # a final expression becomes the list of per-rank values

The cell sees ``rank``, ``world_size``, ``device``, ``torch``, ``dist`` and the
notebook's own variables that it names (sent by value, like ``launch``).

Warm ranks (``parlab.launch.warm``) get a line magic and a cell magic:

    %parlab start -n 4 [--timeout S] [--backend B] [--debug] [--seed N]
    %%rank [--timeout S]
    model = torch.nn.Linear(4, 4)   # stays on each rank for the next %%rank cell
    %parlab names | reset | restart | stop

``%%rank`` has the cell semantics of ``%%torchrun`` (same names, last
expression returned per rank) but runs on the group that ``%parlab start``
(or ``parlab.start``) started last, in each rank's lasting namespace.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import re
import shlex
import sys



#: The magics' flags: (flags, LaunchOptions field, how the text is read).  No defaults here:
#: a flag left out is left out of the call, and ``LaunchOptions`` fills in its default.
_FLAGS = [(("-n", "--nproc"), "nproc", int), (("--timeout",), "timeout", float),
          (("--backend",), "backend", str), (("--debug",), "debug", None), (("--seed",), "seed", int),
          (("--nnodes",), "nnodes", int), (("--scheduler",), "scheduler", str), (("--gpus",), "gpus", int),
          (("--partition",), "partition", str), (("--account",), "account", str),
          (("--time-limit",), "time_limit", float)]
#: What ``%parlab start`` takes: the options of ``start`` (a warm group runs locally, on one node).
_WARM_FLAGS = ("nproc", "timeout", "backend", "debug", "seed")


def _parser(prog: str = "%%torchrun", names=None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, add_help=False, exit_on_error=False,
                                argument_default=argparse.SUPPRESS)
    for flags, dest, kind in _FLAGS:
        if names is None or dest in names:
            if kind is None:
                p.add_argument(*flags, dest=dest, action="store_true")
            else:
                p.add_argument(*flags, dest=dest, type=kind)
    return p


_USAGE = ("Usage: %%torchrun -n 4 [--timeout S] [--backend gloo|nccl] [--debug] [--seed N] [--nnodes N] "
          "[--scheduler slurm --gpus G --partition P --account A --time-limit MIN]")


def parse_line(line: str, prog: str = "%%torchrun", names=None, usage: str = _USAGE) -> dict:
    """The options given on a magic's line, by ``LaunchOptions`` field name (only those given)."""
    try:
        opts, rest = _parser(prog, names).parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as exc:
        raise ValueError(f"{prog}: {exc}. {usage}") from None
    if rest:
        raise ValueError(f"{prog}: unknown option(s) {' '.join(rest)}. {usage}")
    return vars(opts)


def names_used(tree: ast.AST) -> set[str]:
    """Every name the cell reads (we send only those notebook variables)."""
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


_IPYTHON_HISTORY = re.compile(r"^(_+|_i+|_i\d+|_\d+|_oh|_ih|_dh)$")


_PROVIDED = {"rank", "world_size", "device", "torch", "dist", "parlab", "In", "Out", "exit", "quit",
             "get_ipython"}


def torchrun(line: str, cell: str, ipython=None):
    __tracebackhide__ = True  # IPython hides the magic's own frames
    from . import run_cell

    opts = parse_line(line)
    count, filename, names, has_value = _prepare_cell(cell, ipython, "torchrun")
    results = run_cell(cell, names, filename=filename, label=f"Cell In[{count}]" if count is not None else None,
                       **opts)
    return results if has_value else None


def rank(line: str, cell: str, ipython=None):
    """``%%rank [--timeout S]``: the cell on every rank of the warm group, in its lasting namespace."""
    __tracebackhide__ = True  # IPython hides the magic's own frames
    from .warm import current

    parser = argparse.ArgumentParser(prog="%%rank", add_help=False, exit_on_error=False)
    parser.add_argument("--timeout", type=float, default=None)
    try:
        opts, rest = parser.parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as exc:
        rest = [str(exc)]
    if rest:
        raise ValueError(f"%%rank: cannot read {' '.join(rest)!r}. Usage: %%rank [--timeout S] (the ranks "
                         "and backend are the warm group's: see %parlab start)")
    group = current()
    count, filename, names, has_value = _prepare_cell(cell, ipython, "rank")
    results = group.run_cell(cell, names, filename=filename, timeout=opts.timeout,
                             label=f"Cell In[{count}]" if count is not None else None)
    return results if has_value else None


_PARLAB_USAGE = ("Usage: %parlab start -n 4 [--timeout S] [--backend gloo|nccl] [--debug] [--seed N] | "
                 "%parlab names | %parlab reset | %parlab restart | %parlab stop")


def parlab_line(line: str, ipython=None):
    """``%parlab start|names|reset|restart|stop``: the warm group that ``%%rank`` cells use."""
    __tracebackhide__ = True  # IPython hides the magic's own frames
    from . import warm
    from .options import LaunchOptions

    words = shlex.split(line)
    action, rest = (words[0], words[1:]) if words else ("", [])
    if action == "start":
        opts = parse_line(shlex.join(rest), "%parlab start", _WARM_FLAGS, _PARLAB_USAGE)
        options = LaunchOptions(**opts)  # checked before the running group is replaced
        if warm.running() is not None:
            warm.running().stop()  # one group per kernel for %%rank: starting again replaces it
        group = warm.start_group(options)
        print(f"parlab: {group.nproc} warm ranks ({group.backend}) ready; %%rank cells run on them")
        return None
    if action in ("names", "reset", "restart", "stop") and not rest:
        if action == "stop" and warm.running() is None:
            print("parlab: no warm group is running")
            return None
        group = warm.current()
        result = getattr(group, action)()
        if action == "stop":
            print(f"parlab: the {group.nproc} warm ranks stopped")
        return result
    raise ValueError(f"%parlab: cannot read {line!r}. {_PARLAB_USAGE}")


def _prepare_cell(cell: str, ipython, kind: str):
    """(cell number, file name, notebook variables to send, whether the cell ends in an expression)."""
    count = _current_cell_number(ipython)
    filename = f"<{kind}-cell-{count}>"
    # One parse; a SyntaxError here points at the cell's own line.
    tree = compile(cell, filename, "exec", ast.PyCF_ONLY_AST)
    wanted = names_used(tree)
    user_ns = ipython.user_ns if ipython is not None else {}
    names, skipped = {}, []
    from . import pickling

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
        print(f"%%{kind}: these notebook variables cannot be sent to the ranks and will be undefined "
              f"there: {', '.join(skipped)}", file=sys.stderr)
    has_value = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
    return count, filename, names, has_value


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

    def rank_magic(line, cell):
        __tracebackhide__ = True
        return rank(line, cell, ipython)

    def parlab_magic(line):
        __tracebackhide__ = True
        return parlab_line(line, ipython)

    magic.__doc__ = rank_magic.__doc__ = parlab_magic.__doc__ = __doc__
    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchrun")
    ipython.register_magic_function(rank_magic, magic_kind="cell", magic_name="rank")
    ipython.register_magic_function(parlab_magic, magic_kind="line", magic_name="parlab")
