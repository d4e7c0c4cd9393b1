"""Run code from a notebook on many ranks through torchrun.

``launch(fn)`` pickles ``fn`` (by value when it was defined in the notebook),
starts torchrun tied to this kernel, streams each rank's output into the
cell, and returns the ranks' results in rank order.  However the launch ends
(return, error, timeout, interrupt), every process it started is ended by pid
and its files removed.

This package is also callable: ``parlab.launch`` is this module, and
``parlab.launch(fn, nproc=2)`` calls :func:`launch`, so ``from parlab import
launch`` and ``from parlab.launch.job import Job`` both work.

Modules: ``options`` (``LaunchOptions``: every option checked once, and the checks of what is sent), ``tasks`` and ``pickling`` (what
travels to the ranks), ``job`` (process life cycle), ``jobdir`` (the shared
files), ``worker`` and ``agent`` (the rank and torchrun side), ``output``
(where rank output goes), ``stacks`` (where each rank was), ``report``
(facts -> exception), ``failures`` (the kind of a failure), ``results``
(plain results), ``procs`` (process identity), ``magic`` (``%%torchrun``,
``%%rank``, ``%parlab``), ``warm`` and ``warm_worker`` (warm groups: ``start``),
``slurm``, ``slurm_tether`` and ``nodes`` (the Slurm queue and several nodes),
``queue_offer`` (a lab cell's "run this through the queue" gate: ``offer_queue``),
``tracebacks`` (the launcher's frames cut from what a student sees: ``bare``).
"""
from __future__ import annotations

import os
import sys
import types

from . import tracebacks
from .errors import LaunchError, LaunchTimeout, WorkerError
from .job import Job
from .options import DEFAULT_TIMEOUT, LaunchOptions, check_call, choose_backend
from .queue_offer import offer_queue, queue_configured
from .runtime import device
from .tasks import CellTask, ScriptTask
from .tracebacks import bare
from .warm import WarmGroup, start


def launch(fn, args=(), kwargs=None, *, nproc=None, backend=None, timeout=None, env=None,
           debug=None, seed=0, plain_results=False, nnodes=None, scheduler=None, gpus=None,
           partition=None, account=None, time_limit=None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nproc`` ranks and return their results in rank order.

    Inside each rank the process group is initialised, ``parlab.device()`` is
    the rank's device, and torch/random/numpy are seeded with ``seed + rank``.

    Every option is checked once, by ``LaunchOptions`` (``options.py``), before anything starts.

    Args:
        nproc: number of ranks; default the visible GPUs, or 2 on CPU.
        backend: "gloo", "nccl" or "mpi"; default NCCL when every rank can
            have its own GPU, else gloo.  Under NCCL the group also has gloo
            for CPU tensors ("cpu:gloo,cuda:nccl").
        timeout: seconds before the launch is stopped with LaunchTimeout
            (default ``PARLAB_TIMEOUT`` or 120).  The process group's own
            timeout is half of it, so a stuck collective fails first.
        env: extra environment variables for the ranks.
        debug: turn on ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which names
            mismatched collectives at once (also ``PARLAB_DEBUG=1``).
        seed: base seed, a whole number; rank r uses ``seed + r``, which must be
            a seed numpy takes (0 to 2**32 - 1).
        plain_results: each rank must return plain data (exact
            ``torch.Tensor``, numbers, str, bytes, None, and lists, tuples and
            dicts of them); it comes back through ``torch.load(weights_only=True)``
            so that loading a result never runs code in the caller.
        nnodes: nodes to spread the ranks over (``nproc`` in all, the same
            number on each), one torchrun agent per node meeting at a c10d
            rendezvous; locally the nodes are agents on this machine.
        scheduler: "local" (default) or "slurm": wait in a Slurm queue for
            ``gpus`` and run there (``slurm.py``).  ``PARLAB_SCHEDULER`` does
            not change this default; it turns on the labs' queue cells.
        gpus: GPUs to ask Slurm for, in all (default ``nproc`` defaults to it).
        partition, account: Slurm's (default ``PARLAB_SLURM_PARTITION``,
            ``PARLAB_SLURM_ACCOUNT``, else the default partition).
        time_limit: minutes Slurm lets the job run (default: the partition's);
            ``timeout`` counts from the moment the job starts, not while it waits.
    """
    __tracebackhide__ = True  # IPython hides launcher frames
    task = check_call(fn, args, kwargs)
    try:
        options = LaunchOptions(nproc, backend, timeout, env, debug, seed, plain_results, nnodes=nnodes,
                                scheduler=scheduler, gpus=gpus, partition=partition, account=account,
                                time_limit=time_limit)
        return Job(task, options).run()
    except (LaunchError, KeyboardInterrupt) as exc:
        raise bare(exc) from None


def run_script(path, nproc=None, args=(), *, backend=None, timeout=None, env=None, debug=None,
               seed=0, nnodes=None, scheduler=None, gpus=None, partition=None, account=None,
               time_limit=None) -> list:
    """Run a Python file on ``nproc`` ranks as ``__main__``, like ``torchrun path *args``.

    The process group is already up when the script starts; a script that
    calls ``init_process_group`` itself keeps working.  Returns one None per rank.
    ``nnodes``, ``scheduler``, ``gpus``, ``partition``, ``account`` and
    ``time_limit`` are as for :func:`launch`.
    """
    __tracebackhide__ = True  # IPython hides launcher frames
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"run_script: no such file {path!r}")
    try:
        options = LaunchOptions(nproc, backend, timeout, env, debug, seed, nnodes=nnodes, scheduler=scheduler,
                                gpus=gpus, partition=partition, account=account, time_limit=time_limit)
        return Job(ScriptTask(path, [str(a) for a in args]), options).run()
    except (LaunchError, KeyboardInterrupt) as exc:
        raise bare(exc) from None


def run_cell(source, names, *, nproc=None, backend=None, timeout=None, env=None, debug=None,
             seed=0, filename="<torchrun cell>", label=None, nnodes=None, scheduler=None, gpus=None,
             partition=None, account=None, time_limit=None) -> list:
    """Run a cell's source on every rank (the engine behind ``%%torchrun``)."""
    __tracebackhide__ = True  # IPython hides launcher frames
    try:
        options = LaunchOptions(nproc, backend, timeout, env, debug, seed, nnodes=nnodes, scheduler=scheduler,
                                gpus=gpus, partition=partition, account=account, time_limit=time_limit)
        job = Job(CellTask(source, filename, names), options)
        job.sources[filename] = source
        if label:
            job.labels[filename] = label
        return job.run()
    except (LaunchError, KeyboardInterrupt) as exc:
        raise bare(exc) from None


class _CallableModule(types.ModuleType):
    """``parlab.launch`` is both this package and the function :func:`launch`."""

    def __call__(self, fn, *args, **kwargs):
        __tracebackhide__ = True  # IPython hides launcher frames
        return launch(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
tracebacks.install()
__wrapped__ = launch  # inspect.signature(parlab.launch) shows launch's signature

__all__ = ["DEFAULT_TIMEOUT", "LaunchError", "LaunchOptions", "LaunchTimeout", "WarmGroup", "WorkerError",
           "choose_backend", "device", "launch", "offer_queue", "queue_configured", "run_cell",
           "run_script", "start"]
