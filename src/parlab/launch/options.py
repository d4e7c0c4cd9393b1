"""Check a launch's arguments and fill in defaults, before anything starts."""
from __future__ import annotations

import math
import operator
import os

from . import pickling
from .errors import LaunchError
from .tasks import CallTask, CellTask

#: Default seconds before a launch is stopped.  It suits the CPU labs (a cold
#: 4-rank start costs about 10 s on 2 cores) and stays well below the course's
#: nbgrader cell timeout, so a hang surfaces as LaunchTimeout, not a killed cell.
DEFAULT_TIMEOUT = 120.0
BACKENDS = ("gloo", "nccl", "mpi")


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(nproc, backend):
    """Validate (nproc, backend) and fill in the defaults; raises before anything starts."""
    gpus = None
    if nproc is None:
        gpus = _visible_gpus()
        nproc = gpus or 2
    try:
        if isinstance(nproc, bool):
            raise TypeError
        nproc = operator.index(nproc)  # accepts numpy integers too
    except TypeError:
        raise TypeError(f"nproc must be a whole number of ranks, got {nproc!r}") from None
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if backend is None:
        gpus = _visible_gpus() if gpus is None else gpus
        backend = "nccl" if 0 < nproc <= gpus else "gloo"
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)} "
                         "(gloo runs everywhere, nccl needs one GPU per rank)")
    backend = backend.lower()
    if backend == "nccl":
        gpus = _visible_gpus() if gpus is None else gpus
        if gpus == 0:
            raise LaunchError("backend='nccl' needs GPUs, but this machine has none visible "
                              "(torch.cuda.is_available() is False). Use backend='gloo' to run on CPU.")
        if nproc > gpus:
            raise ValueError(f"backend='nccl' needs one GPU per rank: nproc={nproc} but only {gpus} "
                             f"GPU(s) are visible. Use nproc<={gpus}, or backend='gloo' for CPU ranks.")
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise LaunchError("backend='mpi' is not available in this torch build (it needs torch "
                              "compiled with MPI). Use backend='gloo' on CPU or 'nccl' on GPUs.")
    return nproc, backend


def check_backend_name(backend) -> str:
    """The backend of a Slurm launch: as given, or "auto" (the node picks NCCL when it has the GPUs)."""
    if backend is None:
        return "auto"
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend.lower()


def check_timeout(timeout) -> float:
    source = "timeout"
    if timeout is None:
        source, timeout = "PARLAB_TIMEOUT", os.environ.get("PARLAB_TIMEOUT", DEFAULT_TIMEOUT)
        try:
            timeout = float(timeout)
        except ValueError:
            pass
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def check_env(env) -> dict:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables, got {type(env).__name__}")
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"env keys and values must be strings; not so for {bad!r}: "
                        "write e.g. env={'MY_FLAG': '1'}")
    return dict(env)


def check_call(fn, args, kwargs) -> CallTask:
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on each rank, got {type(fn).__name__}")
    if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}: "
                        "for a single argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return CallTask(fn, tuple(args), dict(kwargs or {}))


def pickle_task(task) -> bytes:
    try:
        return pickling.dumps(task)
    except Exception as exc:  # noqa: BLE001 - name the culprit instead
        culprit = _find_unpicklable(task)
        raise TypeError(
            f"{culprit} cannot be sent to the ranks because it cannot be pickled "
            f"({type(exc).__name__}: {exc}). Pass plain data (tensors, numbers, lists, dicts) and "
            "create locks, files, generators, process groups or CUDA state inside the function."
        ) from None


def _find_unpicklable(task) -> str:
    if isinstance(task, CallTask):
        parts = [("the function", task.fn)]
        parts += [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(task.args)]
        parts += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in task.kwargs.items()]
    elif isinstance(task, CellTask):
        parts = [(f"notebook variable {k!r} ({type(v).__name__})", v) for k, v in task.names.items()]
    else:
        parts = []
    for what, obj in parts:
        try:
            pickling.dumps(obj)
        except Exception:  # noqa: BLE001
            return what
    return "the task"


def notebook_sources() -> tuple[dict, dict]:
    """Source text and ``Cell In[n]`` labels of this kernel's cells, for remote tracebacks."""
    import linecache

    labels = {}
    try:
        from IPython import get_ipython

        ip = get_ipython()
        mapping = getattr(getattr(ip, "compile", None), "_filename_map", None) or {}
        labels = {name: f"Cell In[{n}]" for name, n in mapping.items()}
    except ImportError:
        pass
    sources = {}
    for name in labels:
        entry = linecache.cache.get(name)
        if entry and entry[2]:
            sources[name] = "".join(entry[2])
    return sources, labels


def check_debug(debug) -> bool:
    """The diagnostic mode: ``debug`` when given, else whether PARLAB_DEBUG is set (and not 0)."""
    if debug is None:
        return os.environ.get("PARLAB_DEBUG", "") not in ("", "0")
    return bool(debug)
