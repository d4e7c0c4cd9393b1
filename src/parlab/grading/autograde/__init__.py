"""Autograding a submission: nbgrader's execute step and the process that grades its answers.

- ``execute``: ``GuardedExecute``, the execute step ``nbgrader_config.py``
  names as ``parlab.grading.autograde.GuardedExecute``, its kernel manager
  ``BoxedKernelManager``, and ``graded_calls``, which reads a test cell's
  ``labNN.check_x(answer, hidden=...)`` calls;
- ``sandbox``: ``python -m parlab.grading.autograde.sandbox REQUEST.json``,
  the fresh process that grades every answer a notebook handed in;
- ``shared_launches``: the sandbox's first pass, answers that need the same
  world size sharing one launch.

The three names above are imported from ``execute`` when first used, so that
the sandbox and the ranks, which import this package on their way to its
other modules, do not import nbgrader and jupyter_client.
"""
from __future__ import annotations

__all__ = ["BoxedKernelManager", "GuardedExecute", "graded_calls"]


def __getattr__(name: str):
    if name in __all__:
        from . import execute

        return getattr(execute, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
