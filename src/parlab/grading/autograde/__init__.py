"""Autograding a submission: nbgrader's execute step and the process that grades its answers.

- ``execute``: ``GuardedExecute``, the execute step ``nbgrader_config.py``
  names as ``parlab.grading.autograde.GuardedExecute``, its kernel manager
  ``BoxedKernelManager``, and ``graded_calls``, which reads a test cell's
  ``labNN.check_x(answer, hidden=...)`` calls;
- ``sandbox``: ``python -m parlab.grading.autograde.sandbox REQUEST.json``,
  the fresh process that grades every answer a notebook handed in;
- ``shared_launches``: the sandbox's first pass, answers that need the same
  world size sharing one launch;
- ``inert_outputs``: ``InertOutputs``, the step ``nbgrader_config.py`` runs
  right after the execute step, which leaves nothing in the autograded
  notebook (its outputs, its markdown) that could run in the feedback's or
  the formgrader's page.

The four names above are imported from their modules when first used, so
that the sandbox and the ranks, which import this package on their way to
its other modules, do not import nbgrader and jupyter_client.
"""
from __future__ import annotations

import importlib

_HOMES = {"BoxedKernelManager": "execute", "GuardedExecute": "execute", "graded_calls": "execute",
          "InertOutputs": "inert_outputs"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
