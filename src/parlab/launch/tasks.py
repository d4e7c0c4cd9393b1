"""What a rank runs: a function call, a script, or a notebook cell's code.

Each task is a small picklable object whose ``__call__`` runs on the rank
after the process group is up, and returns the rank's result.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass
class CallTask:
    fn: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __call__(self):
        return self.fn(*self.args, **self.kwargs)


@dataclass
class ScriptTask:
    path: str
    argv: list

    def __call__(self):
        import runpy
        import sys

        import torch.distributed as dist

        sys.argv = [self.path, *self.argv]
        original = dist.init_process_group

        def already_initialised(*args, **kwargs):
            # A torchrun-style script sets up its own process group; ours is
            # already up with the same world, so the call is a no-op.
            if not dist.is_initialized():
                original(*args, **kwargs)

        dist.init_process_group = already_initialised
        try:
            runpy.run_path(self.path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            dist.init_process_group = original


RESULT_NAME = "__parlab_result__"


def split_last_expression(source: str) -> str:
    """Rewrite a cell so that a final bare expression is stored as the rank's result."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(id=RESULT_NAME, ctx=ast.Store())], value=last.value), last
        )
        ast.fix_missing_locations(tree)
    return tree


@dataclass
class CellTask:
    source: str
    filename: str
    names: dict

    def __call__(self):
        import torch
        import torch.distributed as dist

        import parlab

        namespace = {
            "__name__": "__main__",
            "torch": torch,
            "dist": dist,
            "parlab": parlab,
            **self.names,
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "device": parlab.device(),
        }
        code = compile(split_last_expression(self.source), self.filename, "exec")
        exec(code, namespace)  # noqa: S102 - running the student's cell is the point
        return namespace.get(RESULT_NAME)
