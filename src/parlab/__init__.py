"""parlab: hands-on labs for distributed-training parallelism.

The launcher (``parlab.launch``: ``launch``, ``run_script``, the ``%%torchrun``
magic; ``start`` for warm ranks that stay up between cells) runs code from a
notebook on many ranks through torchrun.  The science core lives in
submodules that are imported on first use, so ``import parlab`` stays cheap:

- ``parlab.models``    tiny GPT and tiny Hugging Face models built from configs
- ``parlab.data``      byte tokenizer, shipped corpus, per-rank batch split
- ``parlab.reference`` single-process reference training steps
- ``parlab.check``     comparison helpers used by the autograder
- ``parlab.cost``      memory / communication / time cost models
- ``parlab.planner``   memory and step time of a (dp, tp, pp) plan; the fastest plan that fits
- ``parlab.calculator`` the planner as ipywidgets sliders
- ``parlab.trace``     per-rank spans, collective byte counting, memory
- ``parlab.viz``       figures (collectives, Gantt charts, memory, bandwidth, mesh)
- ``parlab.grading``   the labs' autograder checks
"""
from __future__ import annotations

import importlib

from . import launch  # the package parlab.launch, callable as the function launch()
from .launch import LaunchError, LaunchTimeout, WorkerError, device, run_script, start

__all__ = [
    "LaunchError",
    "LaunchTimeout",
    "WorkerError",
    "device",
    "launch",
    "load_ipython_extension",
    "run_script",
    "start",
]
__version__ = "0.1.0"

_SUBMODULES = {"models", "data", "reference", "check", "cost", "planner", "calculator", "trace", "viz",
               "grading"}


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'parlab' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext parlab`` registers the ``%%torchrun`` cell magic."""
    from .launch.magic import register

    register(ipython)
