"""Old home of the launcher, kept so that ``from parlab.launcher import launch`` keeps working.

The launcher lives in the ``parlab.launch`` package now.
"""
from .launch import DEFAULT_TIMEOUT, choose_backend, launch, run_cell, run_script
from .launch.jobdir import sweep_stale_jobs

__all__ = ["DEFAULT_TIMEOUT", "choose_backend", "launch", "run_cell", "run_script", "sweep_stale_jobs"]
